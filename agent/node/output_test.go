package node

import (
	"slices"
	"strings"
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
