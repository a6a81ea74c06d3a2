//go:build linux

package sys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The helpers below serve netio's io_uring backend: the ring needs raw
// descriptors and the addresses of Go-allocated buffers it hands to the
// kernel. The Go heap does not move objects, so an address stays valid
// while the caller keeps the slice reachable; netio keeps every buffer it
// gives the kernel referenced until the matching completion arrives.

// NetAcceptFlags are the accept4 flags for sockets accepted by io_uring.
const NetAcceptFlags = unix.SOCK_CLOEXEC

// Errno numbers netio compares negated io_uring results against.
const (
	NetECANCELED = int32(unix.ECANCELED)
	NetENOBUFS   = int32(unix.ENOBUFS)
	NetEINTR     = int32(unix.EINTR)
	NetEAGAIN    = int32(unix.EAGAIN)
	NetENOENT    = int32(unix.ENOENT)
	NetEALREADY  = int32(unix.EALREADY)
)

// NetSendFlags are the send(2) flags for io_uring sends: no SIGPIPE on a
// closed peer, and retry short sends inside the kernel.
const NetSendFlags = unix.MSG_NOSIGNAL | unix.MSG_WAITALL

// NetErrno turns a negative io_uring result into an error value that
// matches the os and net sentinels with errors.Is.
func NetErrno(res int32) error { return unix.Errno(-res) }

// NetIsErrno reports whether err is (or wraps) the errno numbered n.
func NetIsErrno(err error, n int32) bool {
	var e unix.Errno
	return errors.As(err, &e) && int32(e) == n
}

// BufAddr returns the address of b's first byte (0 for an empty slice).
func BufAddr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// NetBufMem maps size bytes of private anonymous memory for buffers the
// kernel fills (io_uring's provided buffers): zero pages faulted in on
// first use, so a large pool costs only the part a ring actually uses
// (a Go slice of the same size is cleared whole, page by page, when it is
// made), and outside the Go heap. Free it with NetBufMemFree once the
// kernel can no longer write it.
func NetBufMem(size int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return b, nil
}

// NetBufMemFree unmaps memory from NetBufMem; nothing may use b after.
func NetBufMemFree(b []byte) error {
	return os.NewSyscallError("munmap", unix.Munmap(b))
}

// NetBufRingFree unmaps the provided-buffer ring of entries entries that
// giouring's SetupBufRing mapped at ring, once its FreeBufRing has
// unregistered it: that only unregisters it (liburing's
// io_uring_free_buf_ring also unmaps it), so every ring set up would stay
// mapped for good.
func NetBufRingFree[T any](ring *T, entries int) error {
	return os.NewSyscallError("munmap", unix.MunmapPtr(unsafe.Pointer(ring), uintptr(entries)*unsafe.Sizeof(*ring)))
}

// NetEventFD creates a non-blocking, close-on-exec eventfd.
func NetEventFD() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, os.NewSyscallError("eventfd", err)
	}
	return fd, nil
}

// NetEventFDSignal adds one to the eventfd's counter, waking its reader.
func NetEventFDSignal(fd int) error {
	var one [8]byte // the counter is a native-endian uint64
	binary.NativeEndian.PutUint64(one[:], 1)
	for {
		_, err := unix.Write(fd, one[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil // the counter is saturated: the reader is awake anyway
		}
		if err != nil {
			return os.NewSyscallError("write eventfd", err)
		}
		return nil
	}
}

// NetDupFD duplicates fd (close-on-exec), for a socket the io_uring backend
// takes over from a net.Conn or net.Listener.
func NetDupFD(fd uintptr) (int, error) {
	nfd, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err)
	}
	return nfd, nil
}

// NetCloseFD closes a raw descriptor.
func NetCloseFD(fd int) error {
	if err := unix.Close(fd); err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

// NetShutdown shuts a socket down in both directions, which ends any
// operation the kernel has pending on it.
func NetShutdown(fd int) error {
	if err := unix.Shutdown(fd, unix.SHUT_RDWR); err != nil {
		return os.NewSyscallError("shutdown", err)
	}
	return nil
}

// NetSetNoDelay sets TCP_NODELAY on a TCP socket.
func NetSetNoDelay(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return os.NewSyscallError("setsockopt TCP_NODELAY", err)
	}
	return nil
}

// NetSockAddrs returns a connected TCP socket's local and remote addresses.
func NetSockAddrs(fd int) (local, remote netip.AddrPort, err error) {
	ls, err := unix.Getsockname(fd)
	if err != nil {
		return local, remote, os.NewSyscallError("getsockname", err)
	}
	rs, err := unix.Getpeername(fd)
	if err != nil {
		return local, remote, os.NewSyscallError("getpeername", err)
	}
	return sockaddrToAddrPort(ls), sockaddrToAddrPort(rs), nil
}

func sockaddrToAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// More errno numbers for io_uring_enter results.
const (
	NetETIME = int32(unix.ETIME)
	NetEBUSY = int32(unix.EBUSY)
)

// NetTimespec converts d for io_uring's timed waits.
func NetTimespec(d time.Duration) *syscall.Timespec {
	ts := syscall.NsecToTimespec(int64(d))
	return &ts
}

// NetDupConnFD takes a descriptor of its own (close-on-exec) for the socket
// under a net.TCPConn or net.TCPListener.
func NetDupConnFD(c interface {
	SyscallConn() (syscall.RawConn, error)
}) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = NetDupFD(s) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// ioRingParamsSize and ioRingCQFlagsOff describe struct io_uring_params of
// the kernel ABI: 40 bytes of fields, io_sqring_offsets (40 bytes), then
// io_cqring_offsets, whose flags member is at byte 24.
const (
	ioRingParamsSize = 120
	ioRingCQFlagsOff = 80 + 24
)

// NetCQFlags is the flags word of an io_uring completion queue, mapped a
// second time (giouring does not expose its own mapping), so netio can
// switch the registered eventfd's notifications off and on
// (IORING_CQ_EVENTFD_DISABLED) while one of its goroutines waits in
// io_uring_enter anyway. The kernel only reads the word.
type NetCQFlags struct {
	mem  []byte
	word *uint32
}

// NetMapCQFlags maps the CQ flags word of the ring ringFd; params is the
// io_uring_params the ring was set up with (giouring's Params is that
// struct, filled in by io_uring_setup).
func NetMapCQFlags[P any](ringFd int, params *P) (*NetCQFlags, error) {
	if unsafe.Sizeof(*params) != ioRingParamsSize {
		return nil, errors.New("map io_uring CQ flags: params is not struct io_uring_params")
	}
	off := *(*uint32)(unsafe.Add(unsafe.Pointer(params), ioRingCQFlagsOff))
	page := uint32(os.Getpagesize())
	size := (off + 4 + page - 1) / page * page
	// IORING_OFF_SQ_RING (0) maps the rings: the CQ ring shares them on
	// every kernel with IORING_FEAT_SINGLE_MMAP (5.4+), and its offsets
	// are relative to the same base there.
	mem, err := unix.Mmap(ringFd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap io_uring rings", err)
	}
	return &NetCQFlags{mem: mem, word: (*uint32)(unsafe.Pointer(&mem[off]))}, nil
}

// SetEventfd switches the registered eventfd's notifications on or off.
// The store is atomic: the kernel reads the word on every completion it
// posts (a release store; completions posted before it is visible may
// still see the old value, which callers allow for).
func (f *NetCQFlags) SetEventfd(on bool) {
	var v uint32 = 1 // IORING_CQ_EVENTFD_DISABLED
	if on {
		v = 0
	}
	atomic.StoreUint32(f.word, v)
}

// Close unmaps the word.
func (f *NetCQFlags) Close() error {
	if err := unix.Munmap(f.mem); err != nil {
		return os.NewSyscallError("munmap io_uring rings", err)
	}
	return nil
}

// NetParamsSetFlags sets the setup flags (byte 8) of an io_uring_params
// before it is handed to io_uring_setup (giouring's Params keeps its
// fields unexported).
func NetParamsSetFlags[P any](params *P, flags uint32) error {
	if unsafe.Sizeof(*params) != ioRingParamsSize {
		return errors.New("set io_uring setup flags: params is not struct io_uring_params")
	}
	*(*uint32)(unsafe.Add(unsafe.Pointer(params), 8)) = flags
	return nil
}

// NetPollWatcher waits for a descriptor to become readable through Go's
// poller: the waiting goroutine holds no thread and uses no CPU. netio
// watches its io_uring ring's descriptor with it (the ring polls readable
// while its completion queue holds completions). The watcher has a
// descriptor of its own, a duplicate, so closing it leaves the original
// open.
type NetPollWatcher struct {
	f  *os.File
	rc syscall.RawConn
}

// NewNetPollWatcher duplicates fd, makes the file description
// non-blocking (shared with fd) and registers it with Go's poller. It
// fails if the poller cannot watch the descriptor.
func NewNetPollWatcher(fd int, name string) (*NetPollWatcher, error) {
	nfd, err := NetDupFD(uintptr(fd))
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, os.NewSyscallError("set O_NONBLOCK", err)
	}
	f := os.NewFile(uintptr(nfd), name)
	// Only a file the poller registered takes a deadline.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("watch %s through Go's poller: %w", name, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &NetPollWatcher{f: f, rc: rc}, nil
}

// Wait returns nil once ready returns true. It calls ready at once, and
// again each time the descriptor has polled readable since ready's
// previous call began: readiness is edge-triggered, so ready must look at
// everything a readable descriptor may announce. ready gets the watcher's
// descriptor, which it should ignore; it has syscall.RawConn.Read's type
// so that Wait passes it on without wrapping it in a closure (an
// allocation per wait). Wait returns an error wrapping
// os.ErrDeadlineExceeded after Kick (or the deadline of SetDeadline), and
// one wrapping os.ErrClosed after Close. One goroutine at a time may call
// Wait.
func (w *NetPollWatcher) Wait(ready func(fd uintptr) bool) error {
	return w.rc.Read(ready)
}

// SetDeadline makes Wait return at t (the zero time: never).
func (w *NetPollWatcher) SetDeadline(t time.Time) error { return w.f.SetReadDeadline(t) }

// Kick makes a Wait in progress, or the next one, return at once; the
// waiter calls SetDeadline(time.Time{}) before it waits again.
func (w *NetPollWatcher) Kick() error { return w.f.SetReadDeadline(time.Unix(1, 0)) }

// Close ends Wait (waiting for a call of ready in progress) and closes
// the watcher's descriptor.
func (w *NetPollWatcher) Close() error { return w.f.Close() }

// NetGettid returns the calling thread's id.
func NetGettid() int { return unix.Gettid() }

// NetSendNow sends as much of p on the socket fd as it takes without
// blocking (send(2) with MSG_DONTWAIT|MSG_NOSIGNAL) and returns how many
// bytes that was; a socket with no room gives 0 and no error.
func NetSendNow(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)),
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, os.NewSyscallError("send", e)
	}
}
