package node

import (
	"bufio"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Output forwards the ranks' stdout and stderr to the launcher's, a whole
// line at a time: a line is written with one Write under the stream's
// lock, so lines of different ranks never interleave inside a line.
type Output struct {
	prefix Prefix
	multi  bool // more than one rank: terminate a final partial line
	out    lockedWriter
	err    lockedWriter

	wg    sync.WaitGroup
	mu    sync.Mutex
	pipes []*os.File // read ends, closed by wait if ranks' children hold them
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) write(b []byte) {
	l.mu.Lock()
	_, _ = l.w.Write(b)
	l.mu.Unlock()
}

// NewOutput forwards to stdout and stderr, prefixing lines with prefix
// (the zero Prefix: none) and terminating a final partial line when
// multi.
func NewOutput(prefix Prefix, multi bool, stdout, stderr io.Writer) *Output {
	return &Output{
		prefix: prefix,
		multi:  multi,
		out:    lockedWriter{w: stdout},
		err:    lockedWriter{w: stderr},
	}
}

// maxLine bounds how much of one line is held before it is written anyway.
const maxLine = 1 << 20

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
	o.pipes = append(o.pipes, pr)
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		// The read end is closed here, not left to the finalizer: a
		// daemon runs many jobs' Outputs in one process.
		defer pr.Close()
		o.forward(pr, dst, prefix)
	}()
	return pw, nil
}

func (o *Output) forward(r *os.File, dst *lockedWriter, rp rankPrefix) {
	// A small reader: every rank has two of these, and they are zeroed
	// at once when the rank starts (64 KiB each made 8 MiB per 64 ranks).
	// Longer lines come in pieces (ErrBufferFull) up to maxLine.
	br := bufio.NewReaderSize(r, 4<<10)
	var line []byte // grows with the first line: most ranks print none
	var prefix []byte
	start := func() {
		prefix = rp.line(prefix[:0])
		line = append(line[:0], prefix...)
	}
	flush := func() {
		if len(line) > len(prefix) {
			dst.write(line)
		}
		start()
	}
	start()
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		switch {
		case err == nil:
			flush()
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			if len(line) >= maxLine {
				flush()
			}
			continue
		}
		// EOF or closed: a final line without newline.
		if len(line) > len(prefix) && o.multi {
			line = append(line, '\n')
		}
		flush()
		return
	}
}

// Wait waits for every forwarder to reach EOF, at most d; then it closes
// the read ends (a rank's orphaned children may hold the write ends).
func (o *Output) Wait(d time.Duration) {
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }() // ends with the forwarders, waited for below
	select {
	case <-done:
		return
	case <-time.After(d):
	}
	o.mu.Lock()
	for _, p := range o.pipes {
		p.Close()
	}
	o.mu.Unlock()
	<-done
}
