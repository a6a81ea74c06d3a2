package sys

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// heldPair returns a HeldReader over one end of a Unix socket pair and the
// other end as a raw blocking descriptor: a C client's view of PMI_FD.
func heldPair(t *testing.T) (*HeldReader, net.Conn, int) {
	t.Helper()
	a, b, err := Socketpair("held")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.FileConn(a)
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	peer, err := unix.Dup(int(b.Fd()))
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(peer) })
	hr, err := NewHeldReader(nc)
	if err != nil {
		t.Fatalf("NewHeldReader: %v", err)
	}
	return hr, nc, peer
}

// outq is the bytes charged to the sender's socket: what it sent and the
// reader has not freed (SIOCOUTQ).
func outq(t *testing.T, fd int) int {
	t.Helper()
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHeldReaderHoldsUntilWait checks the promise: bytes returned by Read
// stay charged to the sender until the reader is about to wait, and are
// freed then, before it waits.
func TestHeldReaderHoldsUntilWait(t *testing.T) {
	hr, _, peer := heldPair(t)
	req := []byte("cmd=get;key=x\n")
	if _, err := unix.Write(peer, req); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := hr.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], req) {
		t.Fatalf("Read = %q, %v; want %q", buf[:n], err, req)
	}
	if q := outq(t, peer); q == 0 {
		t.Fatal("the request was freed when read: the sender would be woken")
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, 4096)
		n, _ := hr.Read(b) // finds nothing new: frees, then waits
		got <- b[:n]
	}()
	deadline := time.Now().Add(10 * time.Second)
	for outq(t, peer) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("held bytes not freed while the reader waits")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := unix.Write(peer, []byte("next\n")); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "next\n" {
		t.Fatalf("Read after the wait = %q, want only the new bytes", b)
	}
}

// TestHeldReaderStream sends 2 MiB in writes of 1 byte to 64 KiB, far
// more than a send buffer, and reads it back whole and in order: held
// bytes never leave a sender blocked. Then EOF.
func TestHeldReaderStream(t *testing.T) {
	hr, _, peer := heldPair(t)
	want := make([]byte, 2<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	werr := make(chan error, 1)
	go func() {
		rest := want
		for i := 0; len(rest) > 0; i++ {
			n := 1 // a stretch of one-byte writes: one skb per byte
			if i%4096 >= 2048 {
				n = min(len(rest), 1+rng.IntN(64<<10))
			}
			w, err := unix.Write(peer, rest[:min(n, len(rest))])
			if err != nil {
				werr <- err
				return
			}
			rest = rest[w:]
		}
		werr <- unix.Shutdown(peer, unix.SHUT_WR)
	}()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 4096)
	done := make(chan error, 1)
	go func() {
		for {
			n, err := hr.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("Read ended with %v, want io.EOF", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("stuck for 60 s: a sender blocked on held bytes?")
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not what was sent (%d bytes)", len(got), len(want))
	}
}

// TestHeldReaderClose checks that closing the connection ends a waiting
// Read with an error.
func TestHeldReaderClose(t *testing.T) {
	hr, nc, _ := heldPair(t)
	done := make(chan error, 1)
	go func() {
		_, err := hr.Read(make([]byte, 16))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	nc.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Read on a closed connection succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the waiting Read")
	}
}

// TestHeldReaderDeadline: a read deadline set on the connection bounds a
// HeldReader's wait, as it bounds the connection's own Read.
func TestHeldReaderDeadline(t *testing.T) {
	hr, nc, _ := heldPair(t)
	if err := nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := hr.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline = %v, want os.ErrDeadlineExceeded", err)
	}
}

// TestHeldReaderNotSupported: other sockets are refused, so the caller
// reads them as usual.
func TestHeldReaderNotSupported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := NewHeldReader(c); !errors.Is(err, ErrNotSupported) {
		t.Errorf("TCP: NewHeldReader = %v, want ErrNotSupported", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "seqpacket")
	sc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := NewHeldReader(sc); !errors.Is(err, ErrNotSupported) {
		t.Errorf("seqpacket: NewHeldReader = %v, want ErrNotSupported", err)
	}
}

// TestHeldReaderWakesClientOnce is the reason for HeldReader: a client
// that writes a request and sleeps in read(2) for the reply sleeps once a
// request, not twice. Reading its request with read(2) frees the bytes,
// and the kernel wakes the client then for nothing (its wait takes any
// wake-up on its socket), then again for the reply. The server takes
// 50 µs before each reply, as a busy agent does; a reply faster than the
// client's wake-up would hide the first wake.
func TestHeldReaderWakesClientOnce(t *testing.T) {
	const requests = 400
	sleeps := func(t *testing.T, held bool) float64 {
		hr, nc, peer := heldPair(t)
		var in io.Reader = nc
		if held {
			in = hr
		}
		go func() { // the server: a reply for each request line
			buf := make([]byte, 4096)
			for {
				n, err := in.Read(buf)
				if err != nil {
					return
				}
				for range bytes.Count(buf[:n], []byte("\n")) {
					for start := time.Now(); time.Since(start) < 50*time.Microsecond; {
					}
					if _, err := nc.Write([]byte("ok\n")); err != nil {
						return
					}
				}
			}
		}()
		res := make(chan float64, 1)
		go func() {
			runtime.LockOSThread() // the client: one thread, blocking calls
			defer runtime.UnlockOSThread()
			var before, after unix.Rusage
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
				panic(err)
			}
			reply := make([]byte, 3)
			for range requests {
				if _, err := unix.Write(peer, []byte("get\n")); err != nil {
					panic(err)
				}
				for got := 0; got < len(reply); {
					n, err := unix.Read(peer, reply[got:])
					if err != nil || n == 0 {
						panic(err)
					}
					got += n
				}
			}
			if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
				panic(err)
			}
			res <- float64(after.Nvcsw-before.Nvcsw) / requests
		}()
		return <-res
	}
	plain := sleeps(t, false)
	held := sleeps(t, true)
	t.Logf("client sleeps per request: read(2) %.2f, HeldReader %.2f", plain, held)
	if held > 1.4 {
		t.Errorf("client sleeps %.2f times per request with HeldReader, want about 1 (read(2): %.2f)", held, plain)
	}
}

// TestHeldReaderAllocs: a read allocates nothing (it runs once per PMI
// request).
func TestHeldReaderAllocs(t *testing.T) {
	hr, _, peer := heldPair(t)
	buf := make([]byte, 4096)
	req := []byte("cmd=get;key=x\n")
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := unix.Write(peer, req); err != nil {
			t.Fatal(err)
		}
		if _, err := hr.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per Read, want 0", allocs)
	}
}
