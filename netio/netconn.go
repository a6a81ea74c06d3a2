package netio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"
)

// netBackend is the portable backend on Go's net package: TCP with
// TCP_NODELAY, no goroutines of its own. Send writes from the calling
// goroutine; Recv reads from the calling goroutine and decodes in place.
type netBackend struct {
	cfg *Config
}

func (b *netBackend) listen(addr string) (rawListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &netListener{ln: ln.(*net.TCPListener), cfg: b.cfg}, nil
}

func (b *netBackend) dial(ctx context.Context, addr string) (rawConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newNetConn(c.(*net.TCPConn), b.cfg)
}

func (b *netBackend) close() error { return nil }

type netListener struct {
	ln  *net.TCPListener
	cfg *Config
}

func (l *netListener) accept() (rawConn, error) {
	c, err := l.ln.AcceptTCP()
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, ErrClosed
		}
		return nil, err
	}
	nc, err := newNetConn(c, l.cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errConnGone, err)
	}
	nc.dec.Sealed = true
	return nc, nil
}

// unseal lets frames beyond the handshake's in (rawConn). The handshake
// calls it between its Recvs, so rmu is free.
func (c *netConn) unseal() {
	c.rmu.Lock()
	c.dec.Sealed = false
	c.rmu.Unlock()
}

func (l *netListener) addr() net.Addr { return l.ln.Addr() }
func (l *netListener) close() error {
	if err := l.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// netRecvBuf is the size of a net Conn's read buffer.
const netRecvBuf = 64 << 10

// netCopyMax is the largest payload Send copies behind its header into one
// pooled buffer; larger payloads go out with writev, uncopied.
const netCopyMax = 32 << 10

type netConn struct {
	nc     *net.TCPConn
	max    int
	closed atomic.Bool // set by Close before it closes nc

	// Receive side, guarded by rmu.
	rmu   sync.Mutex
	dec   Decoder
	rbuf  []byte // read buffer, netRecvBuf bytes
	emit  func(Frame)
	ready []Frame // decoded, not yet returned; ready[rhead:] are pending
	rhead int
	rerr  error // sticky receive error

	// Send side, guarded by wmu.
	wmu  sync.Mutex
	werr error // sticky send error
}

func newNetConn(c *net.TCPConn, cfg *Config) (*netConn, error) {
	if err := c.SetNoDelay(true); err != nil {
		c.Close()
		return nil, fmt.Errorf("set TCP_NODELAY: %w", err)
	}
	nc := &netConn{
		nc:   c,
		max:  cfg.MaxFrameSize,
		dec:  Decoder{Max: cfg.MaxFrameSize, Handshake: true},
		rbuf: make([]byte, netRecvBuf),
	}
	nc.emit = nc.push
	return nc, nil
}

func (c *netConn) LocalAddr() net.Addr  { return c.nc.LocalAddr() }
func (c *netConn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

func (c *netConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	if err := c.nc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close connection: %w", err)
	}
	return nil
}

func (c *netConn) Recv(ctx context.Context) (Frame, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.rhead < len(c.ready) {
			f := c.ready[c.rhead]
			c.ready[c.rhead] = Frame{}
			c.rhead++
			if c.rhead == len(c.ready) {
				c.ready, c.rhead = c.ready[:0], 0
			}
			return f, nil
		}
		if c.rerr != nil {
			return Frame{}, c.rerr
		}
		if c.closed.Load() {
			return Frame{}, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return Frame{}, err
		}
		stop := watchDeadline(ctx, c.nc.SetReadDeadline)
		n, err := c.nc.Read(c.rbuf)
		stop()
		if n > 0 {
			if derr := c.dec.Feed(c.rbuf[:n], c.emit); derr != nil {
				c.rerr = fmt.Errorf("receive: %w", derr)
				c.nc.Close()
				continue // deliver what was decoded before the bad frame
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Done() != nil {
				if c.rhead < len(c.ready) {
					continue
				}
				if cerr := ctx.Err(); cerr != nil {
					return Frame{}, cerr
				}
				return Frame{}, context.DeadlineExceeded
			}
			c.rerr = c.recvError(err)
		}
	}
}

func (c *netConn) push(f Frame) { c.ready = append(c.ready, f) }

// recvError classifies a read error; the caller holds rmu.
func (c *netConn) recvError(err error) error {
	switch {
	case c.closed.Load() || errors.Is(err, net.ErrClosed):
		return ErrClosed
	case errors.Is(err, io.EOF) && c.dec.Mid():
		return fmt.Errorf("receive: %w: %w", ErrTruncatedFrame, io.ErrUnexpectedEOF)
	case errors.Is(err, io.EOF):
		return ErrPeerClosed
	}
	return fmt.Errorf("receive: %w", err)
}

func (c *netConn) Send(ctx context.Context, f Frame) error {
	if f.Type >= TypeReserved {
		return fmt.Errorf("send frame type %#04x: %w", f.Type, ErrReservedType)
	}
	return c.send(ctx, f)
}

func (c *netConn) send(ctx context.Context, f Frame) error {
	if err := checkSend(f, c.max); err != nil {
		return err
	}
	var (
		bb   *bytebufferpool.ByteBuffer
		bufs net.Buffers
		hdr  [HeaderSize]byte
		size = HeaderSize + len(f.Payload)
	)
	if len(f.Payload) <= netCopyMax {
		bb = bytebufferpool.Get()
		defer bytebufferpool.Put(bb)
		bb.B, _ = AppendFrame(bb.B[:0], f, c.max)
	} else {
		putHeader(hdr[:], f.Type, f.Epoch, len(f.Payload))
		bufs = net.Buffers{hdr[:], f.Payload}
	}

	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := watchDeadline(ctx, c.nc.SetWriteDeadline)
	var n int64
	var err error
	if bb != nil {
		var m int
		m, err = c.nc.Write(bb.B)
		n = int64(m)
	} else {
		n, err = bufs.WriteTo(c.nc)
	}
	stop()
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Done() != nil {
		cerr := ctx.Err()
		if cerr == nil {
			cerr = context.DeadlineExceeded
		}
		if n == 0 {
			return cerr // nothing went out: the stream is intact
		}
		err = fmt.Errorf("interrupted after %d of %d bytes: %w", n, size, cerr)
	}
	switch {
	case c.closed.Load() || errors.Is(err, net.ErrClosed):
		c.werr = ErrClosed
	default:
		c.werr = fmt.Errorf("send: %w", err)
	}
	return c.werr
}

// aLongTimeAgo is a deadline in the past: setting it wakes a blocked
// Read or Write at once.
var aLongTimeAgo = time.Unix(1, 0)

// watchDeadline makes set (a SetReadDeadline or SetWriteDeadline) follow
// ctx for one blocking call, and returns the function that undoes it. A
// context that can never end costs nothing.
func watchDeadline(ctx context.Context, set func(time.Time) error) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	if dl, ok := ctx.Deadline(); ok {
		set(dl)
	}
	fired := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		set(aLongTimeAgo)
		close(fired)
	})
	return func() {
		if !cancel() {
			<-fired // the deadline is being set: wait, then clear it
		}
		set(time.Time{})
	}
}
