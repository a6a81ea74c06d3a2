package netio

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Strangers. Anyone who can reach a listener's port can connect, so what
// a connection may cost before it authenticates is bounded: at most
// maxHandshakes connections are being authenticated at once, and when one
// more arrives the oldest of them the listener has not yet answered with
// its proof is dropped to make room (it answers only a peer that proved
// it knows the secret, so a stranger never holds a slot that cannot be
// dropped, a peer that knows the secret proves itself within a round
// trip, the oldest is nearly always a stranger, and a flood cannot lock
// the job's agents out; see listener.commit); each
// has preAuthTimeout (or Config.HandshakeTimeout if shorter) to finish.
// A dialer whose connection is dropped before the acceptor proved itself
// dials again (Transport.Dial, dialAttempts). Refusals are logged once per
// reason, then counted; Close logs the counts, so a flood costs a few log
// lines, not one per connection.
const (
	// maxHandshakes bounds the connections a listener authenticates at
	// once.
	maxHandshakes = 256
	// preAuthTimeout bounds how long a listener waits for a new
	// connection to authenticate (a silent stranger holds a slot that
	// long at most).
	preAuthTimeout = 2 * time.Second
	// refusalSummaryEvery paces the summaries of a long-lived listener
	// (a daemon's): refusals since the last summary are logged when one
	// more comes at least this long after it.
	refusalSummaryEvery = time.Minute
)

// errConnGone marks a backend's failure to set up one accepted
// connection (its peer reset it before it was taken): that connection is
// refused, the listener goes on.
var errConnGone = errors.New("connection gone before it was set up")

// refusal is why a listener dropped a connection before it authenticated.
type refusal int

const (
	refusedDropped refusal = iota // made room for a newer connection
	refusedSilent                 // did not authenticate in time
	refusedProof                  // proved no knowledge of the secret
	refusedOther                  // spoke something else, or hung up
	numRefusals
)

var refusalNames = [numRefusals]string{"dropped", "silent", "wrong_proof", "other"}

// refusalOf classifies a failed handshake.
func refusalOf(err error) refusal {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return refusedSilent
	case errors.Is(err, errWrongProof):
		return refusedProof
	}
	return refusedOther
}

// refusals counts a listener's refusals, from its accept loop and its
// handshake goroutines. mu serialises the summaries; it is never held
// together with listener.mu.
type refusals struct {
	// count[k] is added to by add and loaded by summary; it publishes
	// nothing else (a summary that misses a refusal being added leaves it
	// to the next one).
	count [numRefusals]atomic.Int64
	// logged[k] is set by the CompareAndSwap in add that logs the first
	// refusal of kind k, so exactly one goroutine logs it; nothing else
	// reads it.
	logged [numRefusals]atomic.Bool

	mu        sync.Mutex         // guards the fields below
	reported  [numRefusals]int64 // counts as of the last summary
	lastShown time.Time          // when the last summary (or the listener) started
}

// add counts a refusal of connection peer and logs it if it is the
// first of its kind, or a summary if the last one is old.
func (r *refusals) add(log *slog.Logger, addr, peer net.Addr, why refusal, err error) {
	r.count[why].Add(1)
	if r.logged[why].CompareAndSwap(false, true) {
		log.Warn("netio: refused connection (further refusals of this kind are counted, not logged)",
			"addr", addr, "peer", peer, "reason", refusalNames[why], "err", err)
		return
	}
	r.mu.Lock()
	due := time.Since(r.lastShown) >= refusalSummaryEvery
	r.mu.Unlock()
	if due {
		r.summary(log, addr)
	}
}

// total is how many connections were refused so far.
func (r *refusals) total() int64 {
	var n int64
	for why := range numRefusals {
		n += r.count[why].Load()
	}
	return n
}

// summary logs the refusals not yet summarised, if any, in one line.
func (r *refusals) summary(log *slog.Logger, addr net.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	args := []any{"addr", addr}
	var total int64
	for why := range numRefusals {
		n := r.count[why].Load()
		d := n - r.reported[why]
		r.reported[why] = n
		total += d
		if d > 0 {
			args = append(args, refusalNames[why], d)
		}
	}
	r.lastShown = time.Now()
	if total > 0 {
		log.Warn(fmt.Sprintf("netio: refused %d connections before authentication", total), args...)
	}
}

// listener turns a backend listener into authenticated Conns. It owns one
// accept goroutine and one goroutine per connection being authenticated;
// Close stops and waits for all of them.
type listener struct {
	t    *transport
	raw  rawListener
	auth time.Duration // the deadline of a new connection's handshake

	ready   chan *conn         // authenticated, not yet accepted
	ctx     context.Context    // ends when the listener closes
	cancel  context.CancelFunc // ends ctx
	wg      sync.WaitGroup     // the accept loop and the handshakes
	refused refusals

	mu sync.Mutex // guards pending
	// pending holds the connections being authenticated, oldest first;
	// at most maxHandshakes. A connection leaves it when its handshake
	// ends, or when it is dropped for a newer one before it committed
	// (then its handshake's context is cancelled: it fails at once).
	pending list.List // of *pending

	once sync.Once
	err  error // Close's result, written inside once
}

func newListener(t *transport, raw rawListener) *listener {
	l := &listener{t: t, raw: raw, auth: min(t.cfg.HandshakeTimeout, preAuthTimeout), ready: make(chan *conn, 64)}
	l.refused.lastShown = time.Now()
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.loop()
	return l
}

func (l *listener) loop() {
	defer l.wg.Done()
	log := l.t.cfg.Logger
	var delay time.Duration
	for {
		rc, err := l.raw.accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			if errors.Is(err, errConnGone) {
				// One stranger's connection, reset before it was set
				// up: refused like any other, without the back-off
				// that a listener's own failure calls for (a stream of
				// such resets slept the loop up to 1 s each, and the
				// job's agents, queued behind them, timed out).
				l.refused.add(log, l.raw.addr(), nil, refusedOther, err)
				continue
			}
			// Out of descriptors and the like: say so once and back
			// off rather than spin.
			if delay == 0 {
				log.Warn("netio: accept failed; retrying with back-off", "addr", l.raw.addr(), "err", err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
			case <-l.ctx.Done():
				return
			}
			continue
		}
		delay = 0
		pc := &pending{rc: rc}
		pc.ctx, pc.cancel = context.WithTimeout(l.ctx, l.auth)
		l.mu.Lock()
		full := false
		if l.pending.Len() >= maxHandshakes {
			full = !l.dropOldestLocked()
		}
		if !full {
			pc.e = l.pending.PushBack(pc)
		}
		l.mu.Unlock()
		if full {
			pc.cancel()
			rc.Close()
			l.refused.add(log, l.raw.addr(), rc.RemoteAddr(), refusedDropped,
				fmt.Errorf("all %d connections being authenticated proved themselves and are being answered", maxHandshakes))
			continue
		}
		l.wg.Add(1)
		go l.authenticate(pc)
	}
}

// dropOldestLocked drops the oldest connection being authenticated that
// has not committed (auth.go's handshake: once the acceptor proves
// itself, the dialer may hold a Conn already), cancelling its handshake;
// false if every one has committed. Under l.mu.
func (l *listener) dropOldestLocked() bool {
	for e := l.pending.Front(); e != nil; e = e.Next() {
		if pc := e.Value.(*pending); !pc.committed {
			l.pending.Remove(e)
			pc.dropped = true
			pc.cancel() // its handshake fails at once
			return true
		}
	}
	return false
}

// pending is a connection being authenticated, in listener.pending.
type pending struct {
	rc     rawConn
	ctx    context.Context    // bounds its handshake: l.auth, or until dropped
	cancel context.CancelFunc // ends ctx

	// Under listener.mu: committed and dropped are never both set.
	e         *list.Element // its element in listener.pending
	committed bool          // about to prove the listener: never dropped
	dropped   bool          // removed from listener.pending for a newer connection
}

// commit is pc's handshake's commit: it may prove the listener unless it
// was dropped.
func (l *listener) commit(pc *pending) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pc.dropped {
		return false
	}
	pc.committed = true
	return true
}

// authenticate runs the handshake of pc.
func (l *listener) authenticate(pc *pending) {
	defer l.wg.Done()
	rc := pc.rc
	err := handshake(pc.ctx, rc, l.t.cfg.Secret, false, func() bool { return l.commit(pc) })
	pc.cancel()
	l.mu.Lock()
	dropped := pc.dropped
	if !dropped {
		l.pending.Remove(pc.e)
	}
	l.mu.Unlock()
	if err != nil {
		rc.Close()
		why := refusalOf(err)
		if dropped {
			why = refusedDropped
			err = fmt.Errorf("dropped for a newer connection: %d wait to authenticate: %w", maxHandshakes, err)
		}
		if dropped || l.ctx.Err() == nil { // not merely cut short by Close
			l.refused.add(l.t.cfg.Logger, l.raw.addr(), rc.RemoteAddr(), why, err)
		}
		return
	}
	c, err := l.t.track(rc)
	if err != nil {
		return
	}
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		c.Close()
	}
}

func (l *listener) Accept(ctx context.Context) (Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
		return nil, fmt.Errorf("accept on %s: %w", l.raw.addr(), ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() net.Addr { return l.raw.addr() }

func (l *listener) Refused() int64 { return l.refused.total() }

func (l *listener) Close() error {
	l.once.Do(func() {
		l.cancel()
		l.err = l.raw.close()
		l.wg.Wait()
		// Nobody accepts any more: close what was authenticated but
		// not taken.
		for {
			select {
			case c := <-l.ready:
				c.Close()
				continue
			default:
			}
			break
		}
		l.refused.summary(l.t.cfg.Logger, l.raw.addr())
		l.t.forgetListener(l)
	})
	return l.err
}
