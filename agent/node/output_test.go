package node

import (
	"bytes"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
)

// eventually waits up to 5 s for the stream to read want.
func eventually(t *testing.T, s *syncbuf.Buffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.String() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("stream reads %q, want %q", s.String(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A line a rank leaves unfinished (a prompt waiting for input) is
// written once the rank pauses; the rest follows it on the same line.
// Another rank's output in between starts on a line of its own, and the
// rest of the first line then gets its prefix again. A final unfinished
// line ends with a newline in a job of several ranks.
func TestOutputPartialLines(t *testing.T) {
	var out syncbuf.Buffer
	o := NewOutput(NewPrefix("[%r] ", ""), true, true, &out, &out)
	w0, err := o.Pipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	w1, err := o.Pipe(1, false)
	if err != nil {
		t.Fatal(err)
	}
	write := func(w interface{ Write([]byte) (int, error) }, s string) {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}

	write(w0, "prompt: ")
	eventually(t, &out, "[0] prompt: ")
	write(w0, "typed")
	eventually(t, &out, "[0] prompt: typed")
	write(w0, "\n")
	eventually(t, &out, "[0] prompt: typed\n")

	write(w0, "half ")
	eventually(t, &out, "[0] prompt: typed\n[0] half ")
	write(w1, "other\n")
	eventually(t, &out, "[0] prompt: typed\n[0] half \n[1] other\n")
	write(w0, "rest\n")
	eventually(t, &out, "[0] prompt: typed\n[0] half \n[1] other\n[0] rest\n")

	before := out.String()
	write(w1, "end without newline")
	w0.Close()
	w1.Close()
	o.Wait(5 * time.Second)
	if got := strings.TrimPrefix(out.String(), before); got != "[1] end without newline\n" {
		t.Errorf("final unfinished line: %q, want it ended with a newline", got)
	}
}

// With one rank, a prompt is written as it pauses and nothing is added.
func TestOutputPromptOneRank(t *testing.T) {
	var out syncbuf.Buffer
	o := NewOutput(Prefix{}, false, true, &out, &out)
	w, err := o.Pipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("Enter the number of intervals: ")); err != nil {
		t.Fatal(err)
	}
	eventually(t, &out, "Enter the number of intervals: ")
	w.Close()
	o.Wait(5 * time.Second)
	if got := out.String(); got != "Enter the number of intervals: " {
		t.Errorf("one rank's final unfinished line: %q, want it as written", got)
	}
}

// Wait gives up on output pipes still open after its bound (a rank's
// background process holds them) and names their ranks; pipes whose
// writers closed are not named.
func TestOutputWaitNamesCutRanks(t *testing.T) {
	var out syncbuf.Buffer
	o := NewOutput(Prefix{}, true, false, &out, &out)
	var held []interface{ Close() error }
	for r := range 4 {
		w, err := o.Pipe(r, r%2 == 1)
		if err != nil {
			t.Fatal(err)
		}
		if r == 1 || r == 2 {
			held = append(held, w) // a background process still has it
			continue
		}
		w.Close()
	}
	defer func() {
		for _, w := range held {
			w.Close()
		}
	}()
	if cut := o.Wait(50 * time.Millisecond); !slices.Equal(cut, []int{1, 2}) {
		t.Errorf("Wait cut the output of ranks %v, want [1 2]", cut)
	}
	if got := rankList([]int{3}) + "; " + rankList([]int{0, 2, 5}); got != "rank 3; ranks 0, 2 and 5" {
		t.Errorf("rankList: %q", got)
	}
}

// The ranks' unfinished lines together are held up to heldMax: past it
// they are written as far as they go, as a line is at maxLine. Before,
// each rank held up to maxLine, and 1,000 ranks in long lines without a
// newline (a progress display, binary output) held 1.4 GB in pmirun.
func TestOutputHeldBounded(t *testing.T) {
	const ranks, each = 48, 1_000_000 // each line below maxLine, all above heldMax
	var out countWriter
	o := NewOutput(Prefix{}, true, false, &out, &out)
	var ws []interface{ Close() error }
	errs := make(chan error, ranks)
	for r := range ranks {
		w, err := o.Pipe(r, false)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
		go func() {
			_, err := w.Write([]byte(strings.Repeat("x", each)))
			errs <- err
		}()
	}
	for range ranks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Every line is read, none finished and no pipe closed: what is not
	// held has been written.
	least := int64(ranks*each - heldMax - ranks*4<<10)
	for deadline := time.Now().Add(5 * time.Second); out.n.Load() < least; {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes written of %d unfinished lines of %d bytes, want at least %d (the rest held)", out.n.Load(), ranks, each, least)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if held := o.held.Load(); held > heldMax+ranks*4<<10 {
		t.Errorf("%d bytes held, want at most heldMax %d and a read each", held, heldMax)
	}
	for _, w := range ws {
		w.Close()
	}
	o.Wait(5 * time.Second)
	if got, want := out.n.Load(), int64(ranks*each); got != want {
		t.Errorf("%d bytes of the lines written, want %d", got, want)
	}
	if held := o.held.Load(); held != 0 {
		t.Errorf("%d bytes held after every line was written", held)
	}
}

// countWriter counts the bytes written to it but newlines.
type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b) - bytes.Count(b, []byte{'\n'})))
	return len(b), nil
}

// Wait is bounded when the launcher's stdout takes nothing (a pager left
// waiting, a terminal stopped with Ctrl-S): a forwarder blocked writing
// to it is left, and Stalled names the stream. Before, Wait waited for
// that write for ever, and pmirun outlived its --timeout as long as its
// reader did.
func TestOutputWaitStalledStream(t *testing.T) {
	unblock := make(chan struct{})
	defer close(unblock)
	var errs syncbuf.Buffer
	o := NewOutput(Prefix{}, true, false, blockedWriter(unblock), &errs)
	w, err := o.Pipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("nobody reads this\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	waited := make(chan []int)
	go func() { waited <- o.Wait(50 * time.Millisecond) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still waits for a write to a stream nobody reads after 5 s")
	}
	if got := o.Stalled(); got != "stdout" {
		t.Errorf("Stalled: %q, want stdout", got)
	}
}

// blockedWriter is a stream nobody reads: a Write blocks until unblock
// is closed.
type blockedWriter chan struct{}

func (b blockedWriter) Write(p []byte) (int, error) {
	<-b
	return len(p), nil
}
