package netio

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAuth(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		t.Run("WrongSecret", func(t *testing.T) { testWrongSecret(t, be) })
		t.Run("NoSecret", func(t *testing.T) { testNoSecret(t, be) })
		t.Run("Silent", func(t *testing.T) { testSilentPeer(t, be) })
		t.Run("Flood", func(t *testing.T) { testFlood(t, be) })
		t.Run("FloodWhileDialling", func(t *testing.T) { testFloodWhileDialling(t, be) })
		t.Run("ResetFlood", func(t *testing.T) { testResetFlood(t, be) })
		t.Run("HelloFlood", func(t *testing.T) { testHelloFlood(t, be) })
		t.Run("BytesAfterProof", func(t *testing.T) { testBytesAfterProof(t, be) })
	})
}

// testWrongSecret: both ends detect the mismatch; the dialer gets ErrAuth,
// the listener logs and never returns the connection.
func testWrongSecret(t *testing.T, be string) {
	var slog, clog logBuffer
	st := newTestTransport(t, be, func(c *Config) { c.Logger = slog.logger() })
	other := []byte(strings.Repeat("not the job secret!!", 2))
	ct := newTestTransport(t, be, func(c *Config) { c.Secret = other; c.Logger = clog.logger() })
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ct.Dial(ctx, ln.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("dial with the wrong secret succeeded")
	}
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "the listener refused this end's proof") {
		t.Fatalf("dial with the wrong secret: %v, want ErrAuth saying the listener refused the proof", err)
	}
	slog.waitLog(t, "refused connection")
	clog.waitLog(t, "authentication failed")
	actx, acancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer acancel()
	if c, err := ln.Accept(actx); err == nil {
		c.Close()
		t.Fatal("listener returned an unauthenticated connection")
	}
	// The right secret still gets in.
	good := newTestTransport(t, be, nil)
	c, err = good.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := ln.Accept(ctx); err != nil {
		t.Fatal(err)
	}
}

// testNoSecret: a client that does not speak the protocol is refused at
// its first bytes, and told so by the connection closing.
func testNoSecret(t *testing.T, be string) {
	var log logBuffer
	st := newTestTransport(t, be, func(c *Config) { c.Logger = log.logger() })
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	log.waitLog(t, "refused connection")
	if !strings.Contains(log.String(), "bad frame magic") {
		t.Fatalf("log does not say why:\n%s", log.String())
	}
	// The server's hello, then the close.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("refused client: %v", err)
	}

	// A forged proof (right protocol, no secret) is refused too.
	nc2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	var hello [1 + nonceSize]byte
	hello[0] = helloVersion
	b, _ := AppendFrame(nil, Frame{Type: typeHello, Payload: hello[:]}, 64)
	b, _ = AppendFrame(b, Frame{Type: typeProof, Payload: make([]byte, 32)}, 64)
	if _, err := nc2.Write(b); err != nil {
		t.Fatal(err)
	}
	log.waitLog(t, "wrong proof")
}

// testSilentPeer: a client that connects and says nothing is dropped after
// the handshake timeout.
func testSilentPeer(t *testing.T, be string) {
	var log logBuffer
	st := newTestTransport(t, be, func(c *Config) { c.Logger = log.logger(); c.HandshakeTimeout = 100 * time.Millisecond })
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	log.waitLog(t, "refused connection")
	if !strings.Contains(log.String(), "deadline exceeded") {
		t.Fatalf("log does not say why:\n%s", log.String())
	}
}

// testFlood: strangers hold more connections open than a listener
// authenticates at once, silent or sending garbage; a dialer that knows
// the secret still gets in at once, and the refusals cost a few log
// lines and a summary, not a line each.
func testFlood(t *testing.T, be string) {
	var log logBuffer
	st := newTestTransport(t, be, func(c *Config) { c.Logger = log.logger() })
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const strangers = 3 * maxHandshakes
	var ncs []net.Conn
	defer func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}()
	for i := range strangers {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("stranger %d: %v", i, err)
		}
		ncs = append(ncs, nc)
		if i%4 == 0 {
			nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		}
	}
	good := newTestTransport(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := good.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial during the flood: %v", err)
	}
	c.Close()
	if c, err = ln.Accept(ctx); err != nil {
		t.Fatalf("accept during the flood: %v", err)
	}
	c.Close()
	ln.Close()
	out := log.String()
	if n := strings.Count(out, "refused connection"); n > int(numRefusals) {
		t.Errorf("%d refusals logged one by one, want at most %d:\n%s", n, numRefusals, clipLog(out))
	}
	m := regexp.MustCompile(`refused (\d+) connections before authentication`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary of the refusals at Close:\n%s", clipLog(out))
	}
	// Every garbage sender is refused; the silent ones are dropped to
	// make room or time out, at least all but maxHandshakes of them.
	n, _ := strconv.Atoi(m[1])
	if n < strangers-maxHandshakes-int(numRefusals) {
		t.Errorf("summary counts %d refusals of %d strangers:\n%s", n, strangers, clipLog(out))
	}
	// Refused says what the summaries say (the one at Close the last).
	total := 0
	for _, m := range regexp.MustCompile(`refused (\d+) connections before authentication`).FindAllStringSubmatch(out, -1) {
		k, _ := strconv.Atoi(m[1])
		total += k
	}
	if got := ln.Refused(); got != int64(total) || got > strangers {
		t.Errorf("Refused() = %d, the summaries count %d, of %d strangers", got, total, strangers)
	}
}

// testFloodWhileDialling: a stranger keeps opening silent connections
// while peers that know the secret dial one after another; every dial
// gets in (the listener drops the oldest waiting connection for a newer
// one, and a dialer dropped meanwhile dials again).
func testFloodWhileDialling(t *testing.T, be string) {
	st := newTestTransport(t, be, nil)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stop := make(chan struct{})
	flooded := make(chan int)
	full := make(chan struct{}) // the stranger holds every handshake slot and goes on
	go func() {
		var ncs []net.Conn
		defer func() {
			for _, nc := range ncs {
				nc.Close()
			}
			flooded <- len(ncs)
		}()
		for len(ncs) < 8*maxHandshakes {
			select {
			case <-stop:
				return
			default:
			}
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return
			}
			ncs = append(ncs, nc)
			if len(ncs) == 2*maxHandshakes {
				close(full)
			}
		}
		<-stop
	}()
	select {
	case <-full:
	case n := <-flooded:
		t.Fatalf("the stranger opened only %d connections", n)
	}
	good := newTestTransport(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const dials = 10
	for i := range dials {
		c, err := good.Dial(ctx, ln.Addr().String())
		if err != nil {
			close(stop)
			<-flooded
			t.Fatalf("dial %d of %d during the flood: %v", i+1, dials, err)
		}
		c.Close()
		if c, err = ln.Accept(ctx); err != nil {
			t.Fatalf("accept %d during the flood: %v", i+1, err)
		}
		c.Close()
	}
	close(stop)
	t.Logf("%d dials got in while a stranger opened %d connections (%d before the first dial)", dials, <-flooded, 2*maxHandshakes)
}

// clipLog keeps a failing test's log output readable.
func clipLog(s string) string {
	if len(s) > 4000 {
		return s[:2000] + "\n...\n" + s[len(s)-2000:]
	}
	return s
}

// testResetFlood: strangers that connect and reset at once (some after a
// few bytes) are refused one by one and leave nothing behind, and the
// job's agents still get in. Over io_uring a connection reset before it
// was taken failed its getpeername, and the listener took that for its
// own failure: it backed off (up to 1 s for each), the sockets queued
// behind it held their descriptors, and a dialler with the secret timed
// out.
func testResetFlood(t *testing.T, be string) {
	st := newTestTransport(t, be, nil)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fds := func() int {
		es, _ := os.ReadDir("/proc/self/fd")
		return len(es)
	}
	ct := newTestTransport(t, be, nil) // the job's agent, dialling after the flood
	before := fds()
	const n = 300
	hello, _ := AppendFrame(nil, Frame{Type: typeHello, Payload: make([]byte, 1+nonceSize)}, handshakeFrameMax)
	for i := range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 1 {
			c.Write(hello[:10])
		}
		c.(*net.TCPConn).SetLinger(0) // close sends a reset
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ct.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial after %d resets: %v", n, err)
	}
	c.Close()
	if c, err := ln.Accept(ctx); err != nil {
		t.Fatalf("accept after %d resets: %v", n, err)
	} else {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for ln.Refused() < n || fds() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d resets refused; %d descriptors open, %d before", ln.Refused(), n, fds(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testHelloFlood: a stranger whose connections each say a valid hello
// (which needs no secret) and then nothing does not lock the job's
// agents out. The listener proved itself on every hello, and a
// connection it had proved itself on was never dropped for a newer one
// (its dialer might hold a Conn already): 256 such connections, renewed
// within the 2 s each may wait, held every slot, and dialling with the
// secret failed.
func testHelloFlood(t *testing.T, be string) {
	st := newTestTransport(t, be, nil)
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hello, _ := AppendFrame(nil, Frame{Type: typeHello, Payload: append([]byte{helloVersion}, make([]byte, nonceSize)...)}, handshakeFrameMax)
	// More strangers than slots, each saying hello again as soon as the
	// listener hangs up on it.
	stop := make(chan struct{})
	var strangers sync.WaitGroup
	defer strangers.Wait()
	defer close(stop)
	for range maxHandshakes + 64 {
		strangers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				nc.Write(hello)
				nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				io.Copy(io.Discard, nc) // until the listener hangs up
				nc.Close()
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // every slot taken
	good := newTestTransport(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const dials = 5
	for i := range dials {
		c, err := good.Dial(ctx, ln.Addr().String())
		if err != nil {
			t.Fatalf("dial %d of %d while strangers' hellos wait: %v (%d refused)", i+1, dials, err, ln.Refused())
		}
		c.Close()
		if c, err = ln.Accept(ctx); err != nil {
			t.Fatalf("accept %d: %v", i+1, err)
		}
		c.Close()
	}
	t.Logf("%d dials got in while %d strangers said hello again and again (%d refused)", dials, maxHandshakes+64, ln.Refused())
}

// testBytesAfterProof: what a stranger sends after its hello and proof
// is not taken in: a dialer sends nothing more until the listener has
// proved itself, which it does only once the dialer has. A stranger's
// large frame right behind its proof was read (and its payload
// allocated) while the listener checked the proof: 100 strangers each
// sending 32 MiB that way cost 100-300 MiB.
func testBytesAfterProof(t *testing.T, be string) {
	var log logBuffer
	st := newTestTransport(t, be, func(c *Config) { c.Logger = log.logger() })
	ln, err := st.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var burst []byte
	burst, _ = AppendFrame(burst, Frame{Type: typeHello, Payload: append([]byte{helloVersion}, make([]byte, nonceSize)...)}, handshakeFrameMax)
	burst, _ = AppendFrame(burst, Frame{Type: typeProof, Payload: make([]byte, 32)}, handshakeFrameMax)
	burst, _ = AppendFrame(burst, Frame{Type: 1, Payload: make([]byte, 32<<20)}, MaxFrameSizeLimit)
	const n = 100
	before := memAlloc()
	var strangers sync.WaitGroup
	for range n {
		strangers.Go(func() {
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return
			}
			defer nc.Close()
			nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			nc.Write(burst) // until the listener hangs up
		})
	}
	strangers.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for ln.Refused() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d strangers refused", ln.Refused(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := memAlloc() - before
	t.Logf("%d strangers: %.1f MiB allocated", n, got/(1<<20))
	if got > 48<<20 {
		t.Fatalf("%d strangers sending 32 MiB after their proof cost %.0f MiB of allocations", n, got/(1<<20))
	}
	// The listener still takes the job's agents, whose frames follow
	// the listener's proof at once.
	ct := newTestTransport(t, be, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ct.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(ctx, Frame{Type: 1, Payload: make([]byte, 1<<20)}); err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if f, err := sc.Recv(ctx); err != nil || len(f.Payload) != 1<<20 {
		t.Fatalf("the agent's first frame: %d bytes, %v", len(f.Payload), err)
	}
}
