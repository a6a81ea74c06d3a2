//go:build !linux

package sys

import (
	"io"
	"net"
)

// HeldReader is Linux-only (SO_PEEK_OFF): elsewhere NewHeldReader answers
// ErrNotSupported and callers read the connection as usual.
type HeldReader struct{ io.Reader }

// NewHeldReader answers ErrNotSupported off Linux.
func NewHeldReader(c net.Conn) (*HeldReader, error) { return nil, ErrNotSupported }
