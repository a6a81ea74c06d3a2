package netio

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
)

var testSecret = bytes.Repeat([]byte{0x5a, 0xc3}, 16)

// forEachBackend runs fn once per backend; the io_uring run is skipped,
// visibly, where the kernel does not allow it.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, be := range []string{BackendNet, BackendUring} {
		t.Run(be, func(t *testing.T) {
			if be == BackendUring {
				if ok, why := probeUring(); !ok {
					t.Skip("io_uring unavailable: " + why)
				}
			}
			fn(t, be)
		})
	}
}

func newTestTransport(t testing.TB, backend string, mod func(*Config)) Transport {
	t.Helper()
	cfg := Config{Backend: backend, Secret: testSecret, getenv: func(string) string { return "" }}
	if mod != nil {
		mod(&cfg)
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("new transport: %v", err)
	}
	if got := tr.Backend().Name; got != backend {
		t.Fatalf("backend %s, want %s", got, backend)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// pair returns a connected, authenticated pair: client dialled from one
// transport, server accepted on another.
func pair(t testing.TB, backend string, mod func(*Config)) (client, server Conn) {
	t.Helper()
	st := newTestTransport(t, backend, mod)
	ct := newTestTransport(t, backend, mod)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept(ctx)
		ch <- res{c, err}
	}()
	client, err = ct.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	return client, r.c
}

func recvTimeout(t testing.TB, c Conn) Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := c.Recv(ctx)
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return f
}

func TestConformance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		t.Run("Echo", func(t *testing.T) { testEcho(t, be) })
		t.Run("ManyFrames", func(t *testing.T) { testManyFrames(t, be) })
		t.Run("LargeFrames", func(t *testing.T) { testLargeFrames(t, be) })
		t.Run("ManyConns", func(t *testing.T) { testManyConns(t, be) })
		t.Run("PeerClose", func(t *testing.T) { testPeerClose(t, be) })
		t.Run("CloseNoLeak", func(t *testing.T) { testCloseNoLeak(t, be) })
		t.Run("DialClosedPort", func(t *testing.T) { testDialClosedPort(t, be) })
		t.Run("PartialFrames", func(t *testing.T) { testPartialFrames(t, be) })
		t.Run("RecvContext", func(t *testing.T) { testRecvContext(t, be) })
		t.Run("SlowReceiver", func(t *testing.T) { testSlowReceiver(t, be) })
		t.Run("Limits", func(t *testing.T) { testLimits(t, be) })
		t.Run("EmptyFrameFlood", func(t *testing.T) { testEmptyFrameFlood(t, be) })
	})
}

func testEcho(t *testing.T, be string) {
	client, server := pair(t, be, nil)
	go func() {
		for {
			f, err := server.Recv(context.Background())
			if err != nil {
				return
			}
			f.Type++
			if server.Send(context.Background(), f) != nil {
				return
			}
		}
	}()
	for i, p := range [][]byte{[]byte("hello"), {}, bytes.Repeat([]byte{7}, 100000)} {
		want := Frame{Type: 10, Epoch: uint64(i) + 1<<40, Payload: p}
		if err := client.Send(context.Background(), want); err != nil {
			t.Fatal(err)
		}
		got := recvTimeout(t, client)
		if got.Type != 11 || got.Epoch != want.Epoch || !bytes.Equal(got.Payload, p) {
			t.Fatalf("echo %d: got type %d epoch %d %d bytes, want type 11 epoch %d %d bytes",
				i, got.Type, got.Epoch, len(got.Payload), want.Epoch, len(p))
		}
	}
	if err := client.Send(context.Background(), Frame{Type: TypeReserved}); !errors.Is(err, ErrReservedType) {
		t.Fatalf("send reserved type: %v, want ErrReservedType", err)
	}
	if client.LocalAddr().String() != server.RemoteAddr().String() {
		t.Fatalf("client local %v != server remote %v", client.LocalAddr(), server.RemoteAddr())
	}
}

// seqPayload is frame i's payload: its index, then bytes derived from it.
func seqPayload(i, n int) []byte {
	p := make([]byte, n)
	binary.BigEndian.PutUint32(p, uint32(i))
	for j := 4; j < n; j++ {
		p[j] = byte(i*31 + j)
	}
	return p
}

func checkSeq(f Frame, i, n int) error {
	if f.Epoch != uint64(i) || f.Type != uint16(i%1000) {
		return fmt.Errorf("frame %d: epoch %d type %d", i, f.Epoch, f.Type)
	}
	if !bytes.Equal(f.Payload, seqPayload(i, n)) {
		return fmt.Errorf("frame %d: payload of %d bytes differs", i, len(f.Payload))
	}
	return nil
}

func frameSize(i int) int { return 4 + (i*7919)%3000 }

func testManyFrames(t *testing.T, be string) {
	client, server := pair(t, be, nil)
	const n = 20000
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	stream := func(from, to Conn) {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range n {
				if err := from.Send(context.Background(), Frame{Type: uint16(i % 1000), Epoch: uint64(i), Payload: seqPayload(i, frameSize(i))}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range n {
				f, err := to.Recv(ctx)
				if err != nil {
					errs <- fmt.Errorf("recv frame %d: %w", i, err)
					return
				}
				if err := checkSeq(f, i, frameSize(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	stream(client, server)
	stream(server, client)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testLargeFrames(t *testing.T, be string) {
	client, server := pair(t, be, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{8 << 20, 3<<20 + 12345, 1, 5 << 20}
	payloads := make([][]byte, len(sizes))
	for i, n := range sizes {
		payloads[i] = make([]byte, n)
		for j := range payloads[i] {
			payloads[i][j] = byte(rng.Uint32())
		}
	}
	var wg sync.WaitGroup
	for _, dir := range [][2]Conn{{client, server}, {server, client}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, p := range payloads {
				if err := dir[0].Send(context.Background(), Frame{Type: 1, Epoch: uint64(i), Payload: p}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, p := range payloads {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				f, err := dir[1].Recv(ctx)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				if f.Epoch != uint64(i) || sha256.Sum256(f.Payload) != sha256.Sum256(p) {
					t.Errorf("large frame %d: epoch %d, %d bytes, want %d bytes intact", i, f.Epoch, len(f.Payload), len(p))
				}
			}
		}()
	}
	wg.Wait()
}

func testManyConns(t *testing.T, be string) {
	st := newTestTransport(t, be, nil)
	ct := newTestTransport(t, be, nil)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the server: echo on every accepted connection
		defer wg.Done()
		for range n {
			c, err := ln.Accept(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				f, err := c.Recv(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Send(ctx, f); err != nil {
					t.Error(err)
				}
				// Wait for the client to close.
				if _, err := c.Recv(ctx); !errors.Is(err, ErrPeerClosed) {
					t.Errorf("server recv after client close: %v", err)
				}
			}()
		}
	}()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := ct.Dial(ctx, ln.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			want := seqPayload(i, 100+i)
			if err := c.Send(ctx, Frame{Type: 3, Epoch: uint64(i), Payload: want}); err != nil {
				t.Error(err)
				return
			}
			f, err := c.Recv(ctx)
			if err != nil || f.Epoch != uint64(i) || !bytes.Equal(f.Payload, want) {
				t.Errorf("conn %d: echo %v epoch %d", i, err, f.Epoch)
			}
		}()
	}
	wg.Wait()
}

func testPeerClose(t *testing.T, be string) {
	client, server := pair(t, be, nil)
	for i := range 3 {
		if err := client.Send(context.Background(), Frame{Type: 5, Epoch: uint64(i), Payload: []byte("bye")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if f := recvTimeout(t, server); f.Epoch != uint64(i) {
			t.Fatalf("frame %d: epoch %d", i, f.Epoch)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := server.Recv(ctx)
	if !errors.Is(err, ErrPeerClosed) || !errors.Is(err, io.EOF) {
		t.Fatalf("recv after peer close: %v, want ErrPeerClosed", err)
	}
	// The error stays.
	if _, err := server.Recv(ctx); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("second recv after peer close: %v", err)
	}
	// The closed side reports ErrClosed.
	if _, err := client.Recv(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("recv on closed conn: %v, want ErrClosed", err)
	}
	if err := client.Send(ctx, Frame{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send on closed conn: %v, want ErrClosed", err)
	}
}

// openFDs counts the process's open descriptors (-1 where /proc is absent).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

func testCloseNoLeak(t *testing.T, be string) {
	probeUring() // its ring and socketpair are not ours to count
	before := runtime.NumGoroutine()
	fdsBefore := openFDs()
	func() {
		cfg := Config{Backend: be, Secret: testSecret, getenv: func(string) string { return "" }}
		st, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := st.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := ct.Dial(ctx, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A Recv blocked in another goroutine must end with Close.
		recvDone := make(chan error, 1)
		go func() {
			_, err := s.Recv(context.Background())
			recvDone <- err
		}()
		if err := c.Send(ctx, Frame{Type: 1, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := <-recvDone; err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := s.Recv(context.Background())
			recvDone <- err
		}()
		// A connection accepted but never taken, closed by the listener.
		if _, err := ct.Dial(ctx, ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.Close(); err != nil {
				t.Fatalf("close conn: %v", err)
			}
		}
		if err := <-recvDone; !errors.Is(err, ErrClosed) {
			t.Fatalf("recv blocked across close: %v, want ErrClosed", err)
		}
		for range 2 {
			if err := ln.Close(); err != nil {
				t.Fatalf("close listener: %v", err)
			}
		}
		if _, err := ln.Accept(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("accept after close: %v", err)
		}
		for range 2 {
			if err := c.Close(); err != nil {
				t.Fatalf("close conn: %v", err)
			}
			if err := st.Close(); err != nil {
				t.Fatalf("close transport: %v", err)
			}
			if err := ct.Close(); err != nil {
				t.Fatalf("close transport: %v", err)
			}
		}
		if _, err := ct.Dial(ctx, ln.Addr().String()); err == nil {
			t.Fatal("dial on a closed transport succeeded")
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	if n := openFDs(); n > fdsBefore {
		t.Fatalf("%d descriptors open after close, %d before", n, fdsBefore)
	}
}

func testDialClosedPort(t *testing.T, be string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tr := newTestTransport(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := tr.Dial(ctx, addr)
	if err == nil {
		c.Close()
		t.Fatal("dial to a closed port succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("dial to a closed port took %v", d)
	}
}

// rawDial connects with a plain TCP socket and performs the dialer's side
// of the handshake by hand, so a test can then write arbitrary bytes.
func rawDial(t *testing.T, addr string, secret []byte) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	var hello [1 + nonceSize]byte
	hello[0] = helloVersion
	copy(hello[1:], "0123456789abcdef0123456789abcdef")
	b, _ := AppendFrame(nil, Frame{Type: typeHello, Payload: hello[:]}, 64)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	readFrame := func() Frame {
		var h [HeaderSize]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			t.Fatalf("raw handshake: %v", err)
		}
		_, _, n, err := parseHeader(h[:], 64)
		if err != nil {
			t.Fatal(err)
		}
		buf := append(h[:], make([]byte, n)...)
		if _, err := io.ReadFull(nc, buf[HeaderSize:]); err != nil {
			t.Fatal(err)
		}
		f, _, err := DecodeFrame(buf, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	peer := readFrame()
	p := proof(secret, labelDialer, hello[1:], peer.Payload[1:])
	b, _ = AppendFrame(nil, Frame{Type: typeProof, Payload: p}, 64)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	if f := readFrame(); !bytes.Equal(f.Payload, proof(secret, labelAcceptor, hello[1:], peer.Payload[1:])) {
		t.Fatal("raw handshake: acceptor's proof is wrong")
	}
	nc.SetDeadline(time.Time{})
	return nc
}

func testPartialFrames(t *testing.T, be string) {
	st := newTestTransport(t, be, nil)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc := rawDial(t, ln.Addr().String(), testSecret)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Frames written in small pieces with pauses, so the receiver sees
	// headers and payloads split across many reads.
	var stream []byte
	const n = 40
	for i := range n {
		stream, _ = AppendFrame(stream, Frame{Type: uint16(i % 1000), Epoch: uint64(i), Payload: seqPayload(i, frameSize(i)%200+4)}, 1<<20)
	}
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for len(stream) > 0 {
			k := min(len(stream), 1+rng.IntN(23))
			if _, err := nc.Write(stream[:k]); err != nil {
				return
			}
			stream = stream[k:]
			if rng.IntN(4) == 0 {
				time.Sleep(200 * time.Microsecond)
			}
		}
	}()
	for i := range n {
		f, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if err := checkSeq(f, i, frameSize(i)%200+4); err != nil {
			t.Fatal(err)
		}
	}
	// A stream cut inside a frame is an error, not a clean close.
	half, _ := AppendFrame(nil, Frame{Type: 1, Payload: make([]byte, 100)}, 1<<20)
	if _, err := nc.Write(half[:50]); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	_, err = s.Recv(ctx)
	if !errors.Is(err, ErrTruncatedFrame) || errors.Is(err, ErrPeerClosed) {
		t.Fatalf("recv of a cut frame: %v, want ErrTruncatedFrame", err)
	}
}

func testRecvContext(t *testing.T, be string) {
	client, server := pair(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := server.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("recv with expired context: %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); ccancel() }()
	if _, err := server.Recv(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("recv with cancelled context: %v", err)
	}
	// The connection survives both.
	if err := client.Send(context.Background(), Frame{Type: 9, Payload: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	if f := recvTimeout(t, server); string(f.Payload) != "still here" {
		t.Fatalf("after cancelled recv: %q", f.Payload)
	}
}

// testSlowReceiver sends far more than the receive queue holds while the
// receiver sleeps: the transport must stop reading and resume, losing and
// reordering nothing.
func testSlowReceiver(t *testing.T, be string) {
	client, server := pair(t, be, func(c *Config) { c.RecvQueue = 1 << 20; c.SendQueue = 256 << 10 })
	const n, size = 160, 200 << 10 // 32 MB
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			if err := client.Send(context.Background(), Frame{Type: uint16(i % 1000), Epoch: uint64(i), Payload: seqPayload(i, size)}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	time.Sleep(200 * time.Millisecond)
	for i := range n {
		f := recvTimeout(t, server)
		if err := checkSeq(f, i, size); err != nil {
			t.Fatal(err)
		}
		if i%40 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// testEmptyFrameFlood: a peer that streams frames with no payload
// (heartbeats) to a receiver that does not take them is held back like
// any other: what the receiver holds is bounded by RecvQueue counting
// the frames' headers too. The io_uring backend counted payload bytes
// only, so it read such a stream for ever, queueing every frame.
func testEmptyFrameFlood(t *testing.T, be string) {
	cfg := func(c *Config) { c.RecvQueue = 1 << 20 }
	st := newTestTransport(t, be, cfg)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	// The peer: the net backend's connection, authenticated, then
	// written to raw, in big writes, as fast as the receiver takes it.
	pc := Config{Secret: testSecret}
	if err := pc.validate(); err != nil {
		t.Fatal(err)
	}
	rc, err := (&netBackend{cfg: &pc}).dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := handshake(ctx, rc, testSecret, true, nil); err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	chunk := make([]byte, 0, 1<<20)
	for len(chunk) < cap(chunk) {
		chunk, _ = AppendFrame(chunk, Frame{Type: 1}, 0)
	}
	// The peer is held back once a write makes no progress for a
	// while; the socket buffers hold a few MiB.
	tc := rc.(*netConn).nc
	const total = 64 << 20 // 4 M frames: more than the socket buffers may hold (tcp_rmem up to 32 MiB)
	start, sent := time.Now(), 0
	for {
		tc.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := tc.Write(chunk)
		sent += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if sent >= total || time.Since(start) > 8*time.Second {
			t.Fatalf("the receiver took %d MiB of empty frames (%d frames) in %v that nobody received: it does not stop reading",
				sent>>20, sent/HeaderSize, time.Since(start).Round(time.Millisecond))
		}
	}
	t.Logf("the peer's writes blocked after %d KiB", sent>>10)
	// What was held is all delivered, in order, once the receiver reads.
	f := recvTimeout(t, server)
	if f.Type != 1 || len(f.Payload) != 0 {
		t.Fatalf("first frame %+v", f)
	}
}

func testLimits(t *testing.T, be string) {
	client, server := pair(t, be, func(c *Config) { c.MaxFrameSize = 1000; c.Linger = 50 * time.Millisecond })
	if err := client.Send(context.Background(), Frame{Payload: make([]byte, 1001)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("send over the limit: %v", err)
	}
	// A Send blocked on a peer that does not read ends with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var err error
	for err == nil {
		err = client.Send(ctx, Frame{Payload: make([]byte, 1000)})
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send to a stalled peer: %v, want DeadlineExceeded", err)
	}
	_ = server
}

func TestChooseBackend(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	for _, tc := range []struct {
		req, env, want string
		err            bool
	}{
		{"net", "uring", "net", false},
		{"auto", "net", "net", false},
		{"", "net", "net", false},
		{"auto", "bogus", "", true},
		{"bogus", "", "", true},
	} {
		got, err := chooseBackend(tc.req, env(tc.env))
		if (err != nil) != tc.err || got.Name != tc.want {
			t.Errorf("chooseBackend(%q, env %q) = %v, %v; want %q (error %v)", tc.req, tc.env, got, err, tc.want, tc.err)
		}
	}
	ok, why := probeUring()
	got, err := chooseBackend("auto", env(""))
	if err != nil {
		t.Fatal(err)
	}
	if (got.Name == BackendUring) != ok || got.Reason == "" {
		t.Fatalf("auto chose %v with probe %v (%s)", got, ok, why)
	}
	t.Logf("auto: %v", got)
	got, err = chooseBackend("uring", env(""))
	if ok != (err == nil) || (!ok && !errors.Is(err, ErrNotSupported)) {
		t.Fatalf("forced uring: %v, %v with probe %v", got, err, ok)
	}
	if _, err := New(Config{Secret: []byte("short")}); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
}

// logBuffer collects log output from several goroutines.
type logBuffer struct{ syncbuf.Buffer }

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// waitLog waits for substr to appear in the log.
func (l *logBuffer) waitLog(t *testing.T, substr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !bytes.Contains([]byte(l.String()), []byte(substr)) {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %q:\n%s", substr, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
