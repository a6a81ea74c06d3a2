package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Output forwards the ranks' stdout and stderr to the launcher's, a whole
// line at a time: a line is written with one Write under the stream's
// lock, so lines of different ranks never interleave inside a line. A
// line still unfinished when its rank has written nothing more for
// partialIdle (a prompt waiting for input, a progress bar) is written as
// far as it goes when partial is set (someone watches the output): the
// rest follows it, unless another rank's output came in between, which
// then starts on a line of its own, and the rest too, with its prefix.
// Without partial a line is never cut but at maxLine, or when the
// unfinished lines of all the ranks would hold more than heldMax.
type Output struct {
	prefix  Prefix
	multi   bool // more than one rank: terminate a final partial line
	partial bool // write an unfinished line once its rank pauses
	out     lockedWriter
	err     lockedWriter

	// held is the bytes of unfinished lines the forwarders hold: each
	// adds what it appends to its line and takes it back when it writes
	// the line; one that finds the sum above heldMax writes what it has.
	held atomic.Int64

	wg    sync.WaitGroup
	mu    sync.Mutex
	pipes map[*os.File]int // read ends still forwarded, to their rank; closed by Wait if ranks' children hold them
}

// lockedWriter is one of the launcher's streams.
type lockedWriter struct {
	mu   sync.Mutex
	w    io.Writer
	open *forwarder // guarded by mu: whose unfinished line the stream ends in, nil at a line's start
	// busy is set while a Write to w is under way (under mu), for
	// Stalled: a stream nobody reads blocks it for ever.
	busy atomic.Bool
}

// forwarder is one rank's stream being forwarded to dst: the stream
// knows it by its address (lockedWriter.open).
type forwarder struct{ dst *lockedWriter }

// write writes line, a line of f's rank that starts with its prefix of
// head bytes, unfinished unless it ends in a newline. cont says it
// continues the line f last wrote unfinished: where the stream still
// ends in that line, the prefix is left out.
func (l *lockedWriter) write(f *forwarder, line []byte, head int, cont bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case cont && l.open == f:
		line = line[head:]
	case cont && len(line) == head+1 && line[head] == '\n':
		return // the end of a line that other output has ended already
	}
	l.busy.Store(true)
	if l.open != nil && l.open != f {
		_, _ = l.w.Write([]byte{'\n'}) // another rank's unfinished line ends here
	}
	_, _ = l.w.Write(line)
	l.busy.Store(false)
	l.open = nil
	if f != nil && len(line) > 0 && line[len(line)-1] != '\n' {
		l.open = f
	}
}

// writeLines writes whole lines that no forwarder read (virtual ranks').
func (l *lockedWriter) writeLines(b []byte) { l.write(nil, b, 0, false) }

// NewOutput forwards to stdout and stderr, prefixing lines with prefix
// (the zero Prefix: none), terminating a final partial line when multi,
// and writing unfinished lines after a pause when partial.
func NewOutput(prefix Prefix, multi, partial bool, stdout, stderr io.Writer) *Output {
	return &Output{
		prefix:  prefix,
		multi:   multi,
		partial: partial,
		out:     lockedWriter{w: stdout},
		err:     lockedWriter{w: stderr},
	}
}

// maxLine bounds how much of one line is held before it is written
// anyway, heldMax how much of all the ranks' unfinished lines together:
// 1,000 ranks each in a line of nearly maxLine held 1.4 GB in pmirun.
// A buffer that grew past keepLine for a long line is let go once the
// line is written, so that a rank holds a large one only while it needs
// it.
const (
	maxLine  = 1 << 20
	heldMax  = 32 << 20
	keepLine = 64 << 10
)

// Pipe returns the write end for rank r's stdout (or stderr) and starts
// forwarding its read end.
func (o *Output) Pipe(r int, stderr bool) (*os.File, error) {
	pr, pw, err := sys.OutputPipe()
	if err != nil {
		return nil, err
	}
	dst := &o.out
	if stderr {
		dst = &o.err
	}
	prefix := o.prefix.forRank(r)
	o.mu.Lock()
	if o.pipes == nil {
		o.pipes = make(map[*os.File]int)
	}
	o.pipes[pr] = r
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		o.forward(pr, dst, prefix)
		// The read end is closed here, not left to the finalizer: a
		// daemon runs many jobs' Outputs in one process.
		o.mu.Lock()
		delete(o.pipes, pr)
		o.mu.Unlock()
		pr.Close()
	}()
	return pw, nil
}

// partialIdle is how long a rank's unfinished line waits for its end
// before what there is of it is written: long enough for a line written
// in pieces at once to stay whole, short for a person at a prompt.
const partialIdle = 50 * time.Millisecond

func (o *Output) forward(r *os.File, dst *lockedWriter, rp rankPrefix) {
	// A small buffer: every rank has two of these, and they are zeroed
	// at once when the rank starts (64 KiB each made 8 MiB per 64 ranks).
	// Longer lines are held up to maxLine, then written in pieces.
	buf := make([]byte, 4<<10)
	f := &forwarder{dst: dst}
	var line []byte // prefix and then the line's bytes; grows with the first line: most ranks print none
	var prefix []byte
	cont := false // the last write left the line unfinished: line continues it
	held := 0     // bytes of line counted in o.held
	start := func() {
		prefix = rp.line(prefix[:0])
		if cap(line) > keepLine {
			line = nil
		}
		line = append(line[:0], prefix...)
	}
	flush := func() {
		if len(line) > len(prefix) {
			f.dst.write(f, line, len(prefix), cont)
			cont = line[len(line)-1] != '\n'
		}
		o.held.Add(-int64(held))
		held = 0
		start()
	}
	// A deadline on the read end (Go's poller: no system call) tells the
	// loop the rank has paused inside a line. Without one (a read end
	// the poller does not hold) lines are only written whole.
	deadlines := o.partial && r.SetReadDeadline(time.Time{}) == nil
	waiting := false // a deadline is set
	start()
	for {
		n, err := r.Read(buf)
		for data := buf[:n]; len(data) > 0; {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				line = append(line, data...)
				held += len(data)
				if total := o.held.Add(int64(len(data))); len(line) >= maxLine || total > heldMax {
					flush()
				}
				break
			}
			line = append(line, data[:i+1]...)
			flush()
			data = data[i+1:]
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			flush() // the rank paused inside a line: what there is of it
		} else if err != nil {
			// EOF or closed: a final line without newline.
			if o.multi && (len(line) > len(prefix) || cont) {
				line = append(line, '\n')
			}
			flush()
			return
		}
		// Wait partialIdle from the line's last bytes: a long line that
		// keeps coming is not cut.
		if pending := len(line) > len(prefix); deadlines && (pending && n > 0 || pending != waiting) {
			var at time.Time
			if pending {
				at = time.Now().Add(partialIdle)
			}
			_ = r.SetReadDeadline(at) // it worked above
			waiting = pending
		}
	}
}

// Wait waits for every forwarder to reach EOF, at most d; then it closes
// the read ends (a rank's orphaned children may hold the write ends) and
// returns the ranks whose output it cut so, once the forwarders have
// ended, or after d more: a forwarder blocked in a write to a stream
// nobody reads (a pager left waiting, a terminal stopped with Ctrl-S;
// Stalled) is left to end by itself, or with the process.
func (o *Output) Wait(d time.Duration) (cut []int) {
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }() // ends with the forwarders, waited for below
	select {
	case <-done:
		return nil
	case <-time.After(d):
	}
	o.mu.Lock()
	for p, r := range o.pipes {
		p.Close()
		if r >= 0 && !slices.Contains(cut, r) {
			cut = append(cut, r)
		}
	}
	o.mu.Unlock()
	select {
	case <-done:
	case <-time.After(d):
	}
	slices.Sort(cut)
	return cut
}

// Linger is Wait(outputLinger) once the last rank ended, with what it
// gave up said on the launcher's stderr: a stream that took nothing for
// that long, or the ranks whose output their processes still held. A
// node's Output lingers so (Node.Close), and pmirun's for the output of
// its agents and daemons.
func (o *Output) Linger() {
	cut := o.Wait(outputLinger)
	switch stalled := o.Stalled(); {
	case stalled == "stdout":
		o.SayStalled(outputLinger)
	case stalled != "":
		// stderr takes nothing: nothing more can be said there.
	case len(cut) > 0:
		o.err.writeLines(fmt.Appendf(nil, "pmirun: stopped forwarding the output of %s: processes they started still held it %v after they ended\n",
			rankList(cut), outputLinger))
	}
}

// SayStalled says on the launcher's stderr that the ranks' output still
// on its way is given up, if the launcher's stdout is what holds it up
// (Stalled): it took none of it for d. It reports whether it said so.
func (o *Output) SayStalled(d time.Duration) bool {
	if o.Stalled() != "stdout" {
		return false
	}
	o.err.writeLines(fmt.Appendf(nil, "pmirun: stopped forwarding the ranks' output: its stdout took none of it for %v\n", d))
	return true
}

// Stalled names the launcher's stream, "stdout" or "stderr", in which a
// write is blocked once Wait has given up on it (nobody reads the
// stream), or returns "". Call it after Wait.
func (o *Output) Stalled() string {
	switch {
	case o.out.busy.Load():
		return "stdout"
	case o.err.busy.Load():
		return "stderr"
	}
	return ""
}
