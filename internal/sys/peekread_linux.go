package sys

import (
	"errors"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HeldReader reads a Unix stream socket without freeing what it read at
// once: it peeks (MSG_PEEK with the socket's peek offset, SO_PEEK_OFF,
// moving past what it returned) and takes the bytes off the socket only
// when it is about to wait for more, or the bytes held pass a bound.
//
// Why: the kernel charges a Unix socket's queued bytes to the sender's
// socket, and freeing them calls the sender's write-space callback, which
// wakes every task sleeping on the sender's socket — including one that
// sleeps in read(2) for the answer to what it just sent (its wait takes
// any wake-up). A PMI client writes a request and sleeps reading the
// reply, so a server that reads each request wakes its client once for
// nothing before the reply wakes it for real: two sleeps and wake-ups of
// the client per request instead of one. Freed when the server is about
// to wait, the request's bytes wake nobody: the client was woken by the
// reply and has not sent its next request (else the peek would have
// returned it), so it does not sleep on the socket — unless it waits for
// a reply that is not ready (a fence), where one extra wake-up per such
// wait is harmless.
//
// Flow control is unchanged: whenever the reader waits, nothing it has
// read is still charged to the sender, as with read(2). Between waits the
// bytes held are bounded (heldMax). A sender whose buffer fills with them
// anyway (thousands of one-byte writes) stops sending; the reader then
// finds nothing new and frees them.
//
// Closing the socket while bytes are held is closing it with bytes
// unread: the peer reads what was sent to it, then ECONNRESET instead of
// end of file. The agent closes a connection whose rank is still there
// only to fail it.
type HeldReader struct {
	rc     syscall.RawConn
	peekFn func(fd uintptr) bool // peek, made once: a closure per Read would allocate
	held   int                   // bytes returned by Read and still on the socket

	// One Read's arguments and results, for peek.
	buf []byte
	n   int
	err error
}

// heldMax bounds the bytes a HeldReader returns without freeing them. A
// Unix socket's send buffer is net.core.wmem_default (208 KiB by
// default), charged with each queued skb's true size, about 768 bytes for
// a small request; 4 KiB of small requests is well inside it.
const heldMax = 4 << 10

// NewHeldReader sets up c for a HeldReader. It answers ErrNotSupported
// unless c is a Unix stream socket (a TCP peer is not woken this way) on a
// kernel with a peek offset (SO_PEEK_OFF); the caller then reads c as
// usual. Once c has a HeldReader, read c only through it.
func NewHeldReader(c net.Conn) (*HeldReader, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, ErrNotSupported
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	stream := false
	var serr error
	if err := rc.Control(func(fd uintptr) {
		typ, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
		if stream = err == nil && typ == unix.SOCK_STREAM; stream {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0)
		}
	}); err != nil {
		return nil, err
	}
	switch {
	case !stream:
		return nil, ErrNotSupported
	case serr == nil:
		r := &HeldReader{rc: rc}
		r.peekFn = r.peek
		return r, nil
	case errors.Is(serr, unix.ENOPROTOOPT), errors.Is(serr, unix.EOPNOTSUPP), errors.Is(serr, unix.EINVAL):
		return nil, ErrNotSupported
	default:
		return nil, errnoErr("setsockopt SO_PEEK_OFF", serr)
	}
}

// Read reads what is available into p, waiting for data when there is
// none; it returns io.EOF when the peer has closed and everything was
// read. Only one goroutine may call Read at a time.
func (r *HeldReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = p, 0, nil
	err := r.rc.Read(r.peekFn)
	n, rerr := r.n, r.err
	r.buf, r.err = nil, nil
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	r.held += n
	return n, nil
}

// peek is Read's one attempt on the socket, under the poller: false asks
// it to wait until the socket is readable and try again.
func (r *HeldReader) peek(fd uintptr) bool {
	if r.held >= heldMax {
		if r.err = r.free(int(fd), r.buf); r.err != nil {
			return true
		}
	}
	n, e := recvPeek(int(fd), r.buf)
	switch {
	case e == unix.EAGAIN:
		// About to wait: free what was read first (see the type).
		r.err = r.free(int(fd), r.buf)
		return r.err != nil
	case e != nil:
		r.err = errnoErr("recvfrom", e)
	}
	r.n = n
	return true
}

// recvPeek peeks at the bytes past the socket's peek offset without
// waiting. It is recvfrom(2) without the source address, which
// unix.Recvfrom would decode and allocate on every call.
func recvPeek(fd int, p []byte) (int, error) {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}

// free takes the held bytes off the socket, using p as scratch space
// (Read has not filled it yet).
func (r *HeldReader) free(fd int, p []byte) error {
	for r.held > 0 {
		n, err := unix.Read(fd, p[:min(len(p), r.held)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return errnoErr("read", err)
		}
		if n == 0 {
			// Held bytes are queued: they are there until read.
			return errors.New("read: socket ended before the bytes peeked")
		}
		r.held -= n
	}
	return nil
}
