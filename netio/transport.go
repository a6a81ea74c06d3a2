package netio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// A Transport makes authenticated frame connections between agents. One
// Transport per process is the intended use; it owns every Listener and
// Conn it creates, and Close closes them all.
type Transport interface {
	// Listen listens on a TCP address ("127.0.0.1:0", ":7000").
	Listen(addr string) (Listener, error)
	// Dial connects to a TCP address and authenticates both ends; it
	// fails with an error wrapping ErrAuth if the peer does not prove it
	// knows the job secret.
	Dial(ctx context.Context, addr string) (Conn, error)
	// Backend says which backend carries the connections and why.
	Backend() BackendInfo
	// Close closes every Listener and Conn of the transport and waits for
	// the transport's goroutines. It is idempotent.
	Close() error
}

// A Listener accepts connections that have passed authentication; peers
// that fail it are counted (the first of each kind logged) and dropped,
// never returned; at most 256 wait to authenticate at once, the oldest
// dropped for a newer one (listener.go).
type Listener interface {
	// Accept returns the next authenticated connection. It fails with
	// ErrClosed once the listener is closed, or with ctx's error.
	Accept(ctx context.Context) (Conn, error)
	// Addr is the address listened on (with the port chosen for ":0").
	Addr() net.Addr
	// Refused is how many connections the listener has dropped before
	// they authenticated (silent, a wrong proof, something else spoken,
	// or dropped for a newer one: docs/security.md).
	Refused() int64
	// Close stops listening, drops connections still being authenticated
	// or not yet accepted, and waits for the listener's goroutines. It is
	// idempotent.
	Close() error
}

// A Conn carries frames both ways between two authenticated agents.
//
// Send and Recv may be called from any goroutines, concurrently with each
// other and with Close. Frames sent by one goroutine arrive in the order
// sent. A typical agent runs one goroutine per Conn that loops on Recv and
// forwards frames into its event loop, and sends from the event loop.
type Conn interface {
	// Send queues f for the peer. It returns once the frame is copied (the
	// caller may reuse f.Payload) and handed to the kernel or queued for
	// it; it blocks while the connection has too much queued (flow
	// control), until ctx is done. An error means the connection is
	// broken; it stays broken. Types at or above TypeReserved are refused.
	Send(ctx context.Context, f Frame) error
	// Recv returns the next frame. When the peer closes the connection
	// Recv returns, after the frames already received, an error wrapping
	// ErrPeerClosed (and io.EOF); after Close it returns ErrClosed. If ctx
	// ends first Recv returns ctx's error and the connection stays usable.
	Recv(ctx context.Context) (Frame, error)
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	// Close gives frames already queued by Send up to Config.Linger to
	// reach the kernel, closes the connection, and waits for the work the
	// connection started. It is idempotent.
	Close() error
}

// Connection errors.
var (
	// ErrClosed: the Conn, Listener or Transport was closed locally.
	ErrClosed = fmt.Errorf("use of closed connection: %w", net.ErrClosed)
	// ErrPeerClosed: the peer closed the connection at a frame boundary.
	ErrPeerClosed = fmt.Errorf("peer closed connection: %w", io.EOF)
	// ErrAuth: the peer failed the challenge–response or broke off.
	ErrAuth = errors.New("peer failed authentication")
	// ErrNotSupported: the io_uring backend was asked for where the kernel
	// (or its configuration, or a seccomp profile) does not allow it.
	ErrNotSupported = errors.New("not supported")
)

// Backend names for Config.Backend and FASTPMI_NETIO.
const (
	BackendAuto  = "auto"
	BackendUring = "uring"
	BackendNet   = "net"
)

// EnvBackend is the environment variable that forces a backend when
// Config.Backend is "auto" (or empty): "uring" or "net".
const EnvBackend = "FASTPMI_NETIO"

// BackendInfo names the backend in use and the reason it was chosen, for
// --verbose output.
type BackendInfo struct {
	Name   string // BackendUring or BackendNet
	Reason string
}

func (b BackendInfo) String() string { return b.Name + " (" + b.Reason + ")" }

// Config configures a Transport. The zero value plus a Secret is valid.
type Config struct {
	// Backend is "auto" (or ""), "uring" or "net". "auto" honours
	// FASTPMI_NETIO, then probes io_uring once per process.
	Backend string
	// Secret is the job secret both ends prove they know (32 random bytes
	// from the launcher; at least 16). The Transport keeps a copy.
	Secret []byte
	// Logger receives refused connections and transport faults; nil
	// discards them. Nothing is logged per frame.
	Logger *slog.Logger
	// MaxFrameSize bounds a frame's payload both ways (default
	// DefaultMaxFrameSize, at most MaxFrameSizeLimit).
	MaxFrameSize int
	// HandshakeTimeout bounds authentication of a new connection
	// (default 10s); a listener gives a connection at most 2s
	// (preAuthTimeout) whatever this says.
	HandshakeTimeout time.Duration
	// SendQueue is the number of bytes a Conn queues before Send blocks
	// (io_uring backend; default 4 MiB). A frame is always accepted
	// into an empty queue, whatever its size.
	SendQueue int
	// RecvQueue is the number of received bytes a Conn holds before it
	// stops reading from the socket until Recv catches up (io_uring
	// backend; default 16 MiB).
	RecvQueue int
	// Linger bounds how long Close waits for queued frames to reach the
	// kernel (default 5s).
	Linger time.Duration

	getenv func(string) string // os.Getenv unless a test sets it
}

const minSecret = 16

func (c *Config) validate() error {
	if c.Backend == "" {
		c.Backend = BackendAuto
	}
	switch c.Backend {
	case BackendAuto, BackendUring, BackendNet:
	default:
		return fmt.Errorf("validate config: backend %q: want auto, uring or net", c.Backend)
	}
	if len(c.Secret) < minSecret {
		return fmt.Errorf("validate config: secret of %d bytes: want at least %d", len(c.Secret), minSecret)
	}
	c.Secret = append([]byte(nil), c.Secret...)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = DefaultMaxFrameSize
	}
	if c.MaxFrameSize < handshakeFrameMax || c.MaxFrameSize > MaxFrameSizeLimit {
		return fmt.Errorf("validate config: max frame size %d: want %d..%d", c.MaxFrameSize, handshakeFrameMax, MaxFrameSizeLimit)
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.SendQueue == 0 {
		c.SendQueue = 4 << 20
	}
	if c.RecvQueue == 0 {
		c.RecvQueue = 16 << 20
	}
	if c.Linger == 0 {
		c.Linger = 5 * time.Second
	}
	if c.HandshakeTimeout < 0 || c.SendQueue < 0 || c.RecvQueue < 0 || c.Linger < 0 {
		return errors.New("validate config: negative timeout or queue size")
	}
	if c.getenv == nil {
		c.getenv = os.Getenv
	}
	return nil
}

// ChooseBackend resolves a Config.Backend value ("auto", "uring", "net")
// to the backend a Transport would use, and why. Probing io_uring happens
// once per process; the answer is cached.
func ChooseBackend(requested string) (BackendInfo, error) {
	return chooseBackend(requested, os.Getenv)
}

func chooseBackend(requested string, getenv func(string) string) (BackendInfo, error) {
	how := "forced by option"
	if requested == "" || requested == BackendAuto {
		switch env := getenv(EnvBackend); env {
		case "", BackendAuto:
			ok, why := probeUring()
			if ok {
				return BackendInfo{BackendUring, "auto: " + why}, nil
			}
			return BackendInfo{BackendNet, "auto: io_uring unavailable: " + why}, nil
		case BackendUring, BackendNet:
			requested, how = env, "forced by "+EnvBackend+"="+env
		default:
			return BackendInfo{}, fmt.Errorf("choose backend: %s=%q: want uring or net", EnvBackend, env)
		}
	}
	switch requested {
	case BackendNet:
		return BackendInfo{BackendNet, how}, nil
	case BackendUring:
		if ok, why := probeUring(); !ok {
			return BackendInfo{}, fmt.Errorf("choose backend uring (%s): %s: %w", how, why, ErrNotSupported)
		}
		return BackendInfo{BackendUring, how}, nil
	}
	return BackendInfo{}, fmt.Errorf("choose backend: %q: want auto, uring or net", requested)
}

// A backend moves frames; the transport around it authenticates, tracks
// and closes what the backend makes.
type backend interface {
	listen(addr string) (rawListener, error)
	dial(ctx context.Context, addr string) (rawConn, error)
	close() error
}

type rawListener interface {
	// accept blocks for the next connection; after close it fails with
	// an error wrapping ErrClosed.
	accept() (rawConn, error)
	addr() net.Addr
	close() error
}

// A rawConn is a backend connection: a Conn whose Send does not check
// the frame type (send) so the handshake can use reserved types, and whose
// decoder limits the first frames to the handshake's size and, on an
// accepted connection, refuses any other until unseal.
type rawConn interface {
	Conn
	send(ctx context.Context, f Frame) error
	// unseal lets frames beyond the handshake's in, on an accepted
	// connection whose dialer proved itself (Decoder.Sealed).
	unseal()
}

// New makes a Transport from cfg.
func New(cfg Config) (Transport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	info, err := chooseBackend(cfg.Backend, cfg.getenv)
	if err != nil {
		return nil, err
	}
	t := &transport{cfg: cfg, info: info, conns: map[*conn]struct{}{}, listeners: map[*listener]struct{}{}}
	switch info.Name {
	case BackendUring:
		t.be, err = newUringBackend(&t.cfg)
		if err != nil {
			return nil, fmt.Errorf("start io_uring backend: %w", err)
		}
	default:
		t.be = &netBackend{cfg: &t.cfg}
	}
	return t, nil
}

type transport struct {
	cfg  Config // read-only after New
	info BackendInfo
	be   backend

	mu        sync.Mutex // guards the fields below
	closed    bool
	conns     map[*conn]struct{}
	listeners map[*listener]struct{}
}

func (t *transport) Backend() BackendInfo { return t.info }

func (t *transport) Listen(addr string) (Listener, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("listen on %s: %w", addr, ErrClosed)
	}
	rl, err := t.be.listen(addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	l := newListener(t, rl)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.Close()
		return nil, fmt.Errorf("listen on %s: %w", addr, ErrClosed)
	}
	t.listeners[l] = struct{}{}
	t.mu.Unlock()
	return l, nil
}

// dialAttempts bounds the connections Dial makes to one address when the
// listener hangs up before proving itself (it drops connections under a
// flood: listener.go); a pause that doubles from dialRetryPause separates
// them.
const (
	dialAttempts   = 8
	dialRetryPause = 20 * time.Millisecond
)

func (t *transport) Dial(ctx context.Context, addr string) (Conn, error) {
	pause := dialRetryPause
	for attempt := 1; ; attempt++ {
		rc, err := t.be.dial(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		hctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
		err = handshake(hctx, rc, t.cfg.Secret, true, nil)
		cancel()
		if err == nil {
			c, err := t.track(rc)
			if err != nil {
				return nil, fmt.Errorf("dial %s: %w", addr, err)
			}
			return c, nil
		}
		rc.Close()
		if !errors.Is(err, errHungUp) || attempt == dialAttempts {
			t.cfg.Logger.Warn("netio: authentication failed", "peer", addr, "attempts", attempt, "err", err)
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, fmt.Errorf("dial %s: %w (after %d attempts: %w)", addr, ctx.Err(), attempt, err)
		}
		pause *= 2
	}
}

// track wraps an authenticated rawConn; it closes rc if the transport is
// closed.
func (t *transport) track(rc rawConn) (*conn, error) {
	c := &conn{rawConn: rc, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		rc.Close()
		return nil, ErrClosed
	}
	t.conns[c] = struct{}{}
	return c, nil
}

func (t *transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	ls := make([]*listener, 0, len(t.listeners))
	for l := range t.listeners {
		ls = append(ls, l)
	}
	cs := make([]*conn, 0, len(t.conns))
	for c := range t.conns {
		cs = append(cs, c)
	}
	t.mu.Unlock()
	errs := make([]error, len(ls)+len(cs)+1)
	for i, l := range ls {
		errs[i] = l.Close()
	}
	// Connections close in parallel: each may linger on a slow peer.
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { errs[len(ls)+i] = c.Close() })
	}
	wg.Wait()
	errs[len(errs)-1] = t.be.close()
	return errors.Join(errs...)
}

func (t *transport) forgetConn(c *conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

func (t *transport) forgetListener(l *listener) {
	t.mu.Lock()
	delete(t.listeners, l)
	t.mu.Unlock()
}

// conn is the Conn handed to callers: the backend's connection, with the
// frame-type check on Send and the transport's bookkeeping on Close.
type conn struct {
	rawConn
	t    *transport
	once sync.Once
	err  error // Close's result, written inside once
}

func (c *conn) Send(ctx context.Context, f Frame) error {
	if f.Type >= TypeReserved {
		return fmt.Errorf("send frame type %#04x: %w", f.Type, ErrReservedType)
	}
	return c.rawConn.send(ctx, f)
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.err = c.rawConn.Close()
		c.t.forgetConn(c)
	})
	return c.err
}

// checkSend validates a frame's size before a backend queues it.
func checkSend(f Frame, max int) error {
	if len(f.Payload) > max {
		return fmt.Errorf("send frame of %d bytes (max %d): %w", len(f.Payload), max, ErrFrameTooLarge)
	}
	return nil
}
