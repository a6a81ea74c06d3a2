package netio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// maxHandshakes bounds the connections a listener authenticates at once;
// more are refused (and logged) rather than queued.
const maxHandshakes = 256

// listener turns a backend listener into authenticated Conns. It owns one
// accept goroutine and one goroutine per connection being authenticated;
// Close stops and waits for all of them.
type listener struct {
	t   *transport
	raw rawListener

	ready  chan *conn         // authenticated, not yet accepted
	slots  chan struct{}      // one token per running handshake
	ctx    context.Context    // ends when the listener closes
	cancel context.CancelFunc // ends ctx
	wg     sync.WaitGroup     // the accept loop and the handshakes

	once sync.Once
	err  error // Close's result, written inside once
}

func newListener(t *transport, raw rawListener) *listener {
	l := &listener{t: t, raw: raw, ready: make(chan *conn, 64), slots: make(chan struct{}, maxHandshakes)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.loop()
	return l
}

func (l *listener) loop() {
	defer l.wg.Done()
	log := l.t.cfg.Logger
	for {
		rc, err := l.raw.accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			// Out of descriptors and the like: say so and back off
			// rather than spin.
			log.Warn("netio: accept failed", "addr", l.raw.addr(), "err", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-l.ctx.Done():
				return
			}
			continue
		}
		select {
		case l.slots <- struct{}{}:
		default:
			log.Warn("netio: refused connection: too many handshakes in progress", "peer", rc.RemoteAddr())
			rc.Close()
			continue
		}
		l.wg.Add(1)
		go l.authenticate(rc)
	}
}

func (l *listener) authenticate(rc rawConn) {
	defer l.wg.Done()
	defer func() { <-l.slots }()
	ctx, cancel := context.WithTimeout(l.ctx, l.t.cfg.HandshakeTimeout)
	err := handshake(ctx, rc, l.t.cfg.Secret, false)
	cancel()
	if err != nil {
		rc.Close()
		if l.ctx.Err() == nil {
			l.t.cfg.Logger.Warn("netio: refused connection", "peer", rc.RemoteAddr(), "addr", l.raw.addr(), "err", err)
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
		l.t.forgetListener(l)
	})
	return l.err
}
