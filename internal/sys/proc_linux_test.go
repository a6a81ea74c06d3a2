package sys

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOutputPipe checks OutputPipe's promises: both ends close-on-exec,
// the read end in the poller (deadlines work, Close wakes a parked read)
// and the write end left blocking, out of it; bytes flow.
func TestOutputPipe(t *testing.T) {
	r, w, err := OutputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// fcntl through SyscallConn: Fd would put the read end in blocking mode.
	fcntl := func(f *os.File, cmd int) int {
		t.Helper()
		rc, err := f.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var ferr error
		if err := rc.Control(func(fd uintptr) { v, ferr = unix.FcntlInt(fd, cmd, 0) }); err != nil || ferr != nil {
			t.Fatalf("%s: fcntl: %v %v", f.Name(), err, ferr)
		}
		return v
	}
	for _, f := range []*os.File{r, w} {
		if fcntl(f, unix.F_GETFD)&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s: FD_CLOEXEC not set", f.Name())
		}
	}
	if err := w.SetWriteDeadline(time.Now().Add(time.Second)); !errors.Is(err, os.ErrNoDeadline) {
		t.Errorf("write end: SetWriteDeadline = %v, want os.ErrNoDeadline (not in the poller)", err)
	}
	if fcntl(w, unix.F_GETFL)&unix.O_NONBLOCK != 0 {
		t.Error("write end non-blocking, want blocking")
	}
	if err := r.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatalf("read end: SetReadDeadline = %v: not in the poller", err)
	}
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with a past deadline = %v", err)
	}
	if err := r.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("line\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "line\n" {
		t.Fatalf("read %q, %v", got, err)
	}

	// A read parked on an open pipe ends when the read end is closed.
	r2, w2, err := OutputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	done := make(chan error, 1)
	go func() {
		_, err := r2.Read(make([]byte, 1))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	r2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("parked read ended with %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the parked read")
	}
}
