//go:build linux

package sys

import (
	"os"
	"syscall"
)

// FileOwner returns the user id owning the file fi describes (from
// os.Stat or os.File.Stat); ok is false when fi carries no owner.
func FileOwner(fi os.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
