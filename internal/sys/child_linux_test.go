package sys

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startSh starts sh -c script with out (nil: /dev/null) as its stdout
// and stderr.
func startSh(t *testing.T, script string, out *os.File, env ...string) *Child {
	t.Helper()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if out == nil {
		out = null
	}
	c, err := StartChild("/bin/sh", []string{"sh", "-c", script}, env, "/tmp", []*os.File{null, out, out}, RankProcAttr())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A child gets its arguments, environment, directory and descriptors;
// Wait gives its exit code, or the signal that killed it; Kill signals
// it until it is reaped, then says so.
func TestStartChild(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := startSh(t, `echo "$X $(pwd)"; exit 3`, w, "X=hello")
	w.Close()
	ws, err := c.Wait()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 100)
	n, _ := r.Read(out)
	r.Close()
	if code, sig, signaled := WaitCode(ws); code != 3 || sig != 0 || signaled || string(out[:n]) != "hello /tmp\n" {
		t.Errorf("exit %d (signal %d, %v), output %q; want 3 and %q", code, sig, signaled, out[:n], "hello /tmp\n")
	}
	if err := c.Kill(); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Kill after Wait: %v, want os.ErrProcessDone", err)
	}

	c = startSh(t, `exec sleep 30`, nil)
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	ws, err = c.Wait()
	if code, sig, signaled := WaitCode(ws); err != nil || code != 128+9 || sig != 9 || !signaled {
		t.Errorf("killed: %d, %d, %v, %v; want 137, signal 9", code, sig, signaled, err)
	}

	_, err = StartChild("/nonexistent/prog", []string{"prog"}, nil, "", []*os.File{os.Stdin, os.Stdout, os.Stderr}, RankProcAttr())
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "fork/exec" || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing program: %v, want a fork/exec *os.PathError of ENOENT", err)
	}
}

// The launcher holds one descriptor per running child, and waiting for
// many children holds no thread each.
func TestChildrenWaitInThePoller(t *testing.T) {
	if !pidfdsWork() {
		t.Skip("no pidfds on this kernel: Wait blocks a thread per child")
	}
	const n = 100
	before := openFDs(t)
	threads0, err := Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]*Child, n)
	for i := range cs {
		cs[i] = startSh(t, `exec sleep 30`, nil) // until killed below
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { _, _ = c.Wait() })
	}
	time.Sleep(200 * time.Millisecond) // every Wait parked
	if held := openFDs(t) - before; held != n {
		t.Errorf("%d descriptors held for %d running children, want one each", held, n)
	}
	threads, err := Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		_ = c.Kill()
	}
	wg.Wait()
	if threads-threads0 > n/4 {
		t.Errorf("%d threads while waiting for %d children (%d before), want far fewer than one each", threads, n, threads0)
	}
	if left := openFDs(t) - before; left != 0 {
		t.Errorf("%d descriptors left after every child was reaped", left)
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// WaitCode decodes both kinds of end.
func TestWaitCode(t *testing.T) {
	for _, tc := range []struct {
		ws        syscall.WaitStatus
		code, sig int
		signaled  bool
	}{
		{0, 0, 0, false},
		{3 << 8, 3, 0, false},
		{syscall.WaitStatus(syscall.SIGTERM), 128 + 15, 15, true},
	} {
		code, sig, signaled := WaitCode(tc.ws)
		if code != tc.code || sig != tc.sig || signaled != tc.signaled {
			t.Errorf("WaitCode(%#x) = %d, %d, %v; want %d, %d, %v", uint32(tc.ws), code, sig, signaled, tc.code, tc.sig, tc.signaled)
		}
	}
}
