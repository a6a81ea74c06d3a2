//go:build linux

package netio

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/valyala/bytebufferpool"
)

// uconn is a connection of the io_uring backend. Its socket belongs to the
// backend's ring from attach to release; callers reach it only through the
// queues below and the backend's methods.
type uconn struct {
	b            *uringBackend
	fd           int
	laddr, raddr net.Addr
	max          int
	reapReady    func(uintptr) bool // c.recvReady, made once: Recv's waits do not allocate

	rq frameQueue // frames the reaper decoded, for Recv

	// Send side, guarded by smu.
	smu     sync.Mutex
	pending *bytebufferpool.ByteBuffer // encoded frames not yet in a send SQE
	pendOff int                        // bytes of pending already sent (by Send, straight to the socket)
	queued  bool                       // pending or a send in flight is being looked after (flushConn was called)
	werr    error                      // sticky send error
	dead    chan struct{}              // closed when werr is set: wakes blocked Sends

	space   chan struct{} // one slot: pending was taken into a send (room for Send)
	drained chan struct{} // one slot: nothing is pending or in flight any more

	closed      atomic.Bool   // Close was called (or the listener dropped c)
	closeCalled chan struct{} // closed with closed: wakes Recv
	finished    chan struct{} // closed when the socket is released

	// Guarded by b.mu.
	id        uint64 // 0 until attached
	emit      func(Frame)
	dec       Decoder
	inflight  *bytebufferpool.ByteBuffer // buffer of the send in flight
	off       int                        // bytes of inflight already sent
	ops       int                        // this connection's SQEs not yet finished
	recvArmed bool                       // the multishot recv is armed
	pausing   bool                       // a cancel of the recv is in flight (flow control, or moving it to another thread)
	armTid    int                        // the thread that armed the recv
	stranger  int                        // the thread that reaped the last recv completions, if not armTid
	strangers int                        // looks in a row that found stranger reaping
	reaps     uint                       // recv completions reaped, for looking at the thread every tidEvery
	moved     time.Time                  // when the recv last moved to another thread
	recvDone  bool                       // EOF or error: no more frames
	closing   bool
	released  bool
}

func newUconn(b *uringBackend, fd int, laddr, raddr net.Addr) *uconn {
	c := &uconn{
		b: b, fd: fd, laddr: laddr, raddr: raddr, max: b.cfg.MaxFrameSize,
		dead:        make(chan struct{}),
		space:       make(chan struct{}, 1),
		drained:     make(chan struct{}, 1),
		closeCalled: make(chan struct{}),
		finished:    make(chan struct{}),
		dec:         Decoder{Max: b.cfg.MaxFrameSize, Handshake: true},
	}
	c.rq.init()
	c.emit = c.rq.push
	c.reapReady = c.recvReady
	return c
}

// unseal lets frames beyond the handshake's in (rawConn); the decoder is
// the reaper's, under b.mu.
func (c *uconn) unseal() {
	c.b.mu.Lock()
	c.dec.Sealed = false
	c.b.mu.Unlock()
}

func (c *uconn) LocalAddr() net.Addr  { return c.laddr }
func (c *uconn) RemoteAddr() net.Addr { return c.raddr }

// fail makes err the connection's send error, once.
func (c *uconn) fail(err error) {
	c.smu.Lock()
	if c.werr == nil {
		c.werr = err
		close(c.dead)
	}
	c.smu.Unlock()
}

// markClosed records the first Close; false if it was not the first.
func (c *uconn) markClosed() bool {
	if c.closed.Swap(true) {
		return false
	}
	close(c.closeCalled)
	return true
}

func (c *uconn) Send(ctx context.Context, f Frame) error {
	if f.Type >= TypeReserved {
		return ErrReservedType
	}
	return c.send(ctx, f)
}

func (c *uconn) send(ctx context.Context, f Frame) error {
	if err := checkSend(f, c.max); err != nil {
		return err
	}
	size := HeaderSize + len(f.Payload)
	limit := c.b.cfg.SendQueue
	c.smu.Lock()
	for {
		if c.werr != nil {
			err := c.werr
			c.smu.Unlock()
			return err
		}
		if c.closed.Load() {
			c.smu.Unlock()
			return ErrClosed
		}
		if c.pending == nil || len(c.pending.B) == 0 || len(c.pending.B)+size <= limit {
			break
		}
		c.smu.Unlock()
		select {
		case <-c.space:
		case <-c.dead:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.smu.Lock()
	}
	if !c.queued && c.pending == nil {
		// Nothing pending, nothing in flight: hand the frame to the
		// socket at once, as far as it takes it without blocking. On
		// loopback and on an idle link that is all of it, and the ring
		// never sees the send (no SQE, no completion to reap, no
		// wake-up of the ring's pollers). The rest — all of it after an
		// error, which the ring's send then reports as it would have —
		// goes through the ring.
		buf := bytebufferpool.Get()
		buf.B, _ = AppendFrame(buf.B[:0], f, c.max)
		n, err := sys.NetSendNow(c.fd, buf.B)
		if err == nil && n == len(buf.B) {
			c.smu.Unlock()
			bytebufferpool.Put(buf)
			return nil
		}
		c.pending, c.pendOff = buf, n
	} else {
		if c.pending == nil {
			c.pending = bytebufferpool.Get()
			c.pending.B = c.pending.B[:0]
		}
		c.pending.B, _ = AppendFrame(c.pending.B, f, c.max)
	}
	room := len(c.pending.B) < limit
	post := !c.queued
	c.queued = true
	c.smu.Unlock()
	if room {
		signal(c.space) // pass the wake-up on to another blocked Send
	}
	if post {
		c.b.flushConn(c)
	}
	return nil
}

func (c *uconn) Recv(ctx context.Context) (Frame, error) {
	for {
		if c.closed.Load() {
			return Frame{}, ErrClosed
		}
		f, ok, resume, err := c.rq.pop(c.b.cfg.RecvQueue / 2)
		if resume {
			c.b.resume(c)
		}
		if ok {
			return f, nil
		}
		if err != nil {
			return Frame{}, err
		}
		// Wait for frames, reaping completions on this goroutine
		// when no other goroutine does.
		if err := c.b.awaitRecv(ctx, c); err != nil {
			return Frame{}, err
		}
	}
}

func (c *uconn) Close() error {
	if !c.markClosed() {
		<-c.finished
		return nil
	}
	// Linger: give frames already queued up to Linger to reach the kernel.
	linger := time.NewTimer(c.b.cfg.Linger)
	defer linger.Stop()
wait:
	for {
		c.smu.Lock()
		busy := c.queued && c.werr == nil
		c.smu.Unlock()
		if !busy {
			break
		}
		select {
		case <-c.drained:
		case <-linger.C:
			break wait
		case <-c.finished:
			break wait
		}
	}
	c.fail(ErrClosed)
	// If the backend is stopping it closes c itself.
	c.b.closeConnAsync(c)
	<-c.finished
	return nil
}

// frameQueue holds frames between the reaper (push) and Recv (pop).
type frameQueue struct {
	notify chan struct{} // one slot: frames or an error arrived

	mu     sync.Mutex // guards the fields below
	frames []Frame    // frames[head:] are pending
	head   int
	bytes  int   // bytes pending as received: headers and payloads (empty frames must count)
	err    error // set once: no more frames after the pending ones
	paused bool  // reading stopped: bytes went over the limit
}

func (q *frameQueue) init() { q.notify = make(chan struct{}, 1) }

// push appends f; the reaper calls signal once per batch.
func (q *frameQueue) push(f Frame) {
	q.mu.Lock()
	q.frames = append(q.frames, f)
	q.bytes += HeaderSize + len(f.Payload)
	q.mu.Unlock()
}

func (q *frameQueue) signal() { signal(q.notify) }

// overLimit reports (and records as paused) that more than limit bytes wait.
func (q *frameQueue) overLimit(limit int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes > limit {
		q.paused = true
	}
	return q.paused
}

func (q *frameQueue) isPaused() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.paused
}

// pop takes the next frame. resume says the queue fell to low bytes while
// paused: the caller has the backend read again.
func (q *frameQueue) pop(low int) (f Frame, ok, resume bool, err error) {
	q.mu.Lock()
	if q.head < len(q.frames) {
		f, ok = q.frames[q.head], true
		q.frames[q.head] = Frame{}
		q.head++
		q.bytes -= HeaderSize + len(f.Payload)
		if q.head == len(q.frames) {
			q.frames, q.head = q.frames[:0], 0
		}
		if q.paused && q.bytes <= low {
			q.paused, resume = false, true
		}
	}
	more := q.head < len(q.frames)
	err = q.err
	q.mu.Unlock()
	if ok && (more || err != nil) {
		q.signal() // another Recv may be waiting
	}
	return f, ok, resume, err
}

// finish records that no more frames will be pushed; the first error wins.
func (q *frameQueue) finish(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
	q.signal()
}

// ulistener is a listening socket of the io_uring backend.
type ulistener struct {
	b        *uringBackend
	fd       int
	laddr    net.Addr
	q        acceptQueue
	finished chan struct{} // closed when the socket is released
	once     sync.Once

	// Guarded by b.mu.
	id       uint64
	armed    bool
	ops      int
	closing  bool
	released bool
}

type acceptResult struct {
	c     *uconn
	err   error
	rearm bool // the multishot accept ended with err: re-arm once reported
}

func (l *ulistener) addr() net.Addr { return l.laddr }

func (l *ulistener) accept() (rawConn, error) {
	for {
		r, ok, done := l.q.pop()
		if ok {
			if r.err != nil {
				if r.rearm {
					l.b.rearmAccept(l)
				}
				return nil, r.err
			}
			return r.c, nil
		}
		if done {
			return nil, ErrClosed
		}
		<-l.q.notify
	}
}

func (l *ulistener) close() error {
	l.once.Do(func() {
		l.b.closeListenerAsync(l)
	})
	<-l.finished
	return nil
}

// acceptQueue holds accepted connections between the reaper and the
// listener's accept loop.
type acceptQueue struct {
	notify chan struct{} // one slot

	mu    sync.Mutex // guards the fields below
	items []acceptResult
	done  bool
}

func (q *acceptQueue) init() { q.notify = make(chan struct{}, 1) }

func (q *acceptQueue) push(r acceptResult) {
	q.mu.Lock()
	q.items = append(q.items, r)
	q.mu.Unlock()
	signal(q.notify)
}

func (q *acceptQueue) pop() (r acceptResult, ok, done bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 {
		r = q.items[0]
		q.items[0] = acceptResult{}
		q.items = q.items[1:]
		if len(q.items) > 0 {
			signal(q.notify)
		}
		return r, true, false
	}
	return r, false, q.done
}

// finish ends the queue and returns what was never popped.
func (q *acceptQueue) finish() []acceptResult {
	q.mu.Lock()
	rest := q.items
	q.items, q.done = nil, true
	q.mu.Unlock()
	signal(q.notify)
	return rest
}
