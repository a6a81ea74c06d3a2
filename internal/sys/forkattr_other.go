//go:build !linux

package sys

// StartWith can set no thread attribute off Linux.
func StartWith(a ForkAttr, start func() error) error {
	if !a.zero() {
		return ErrNotSupported
	}
	return start()
}
