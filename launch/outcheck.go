package launch

import (
	"fmt"
	"io"
	"sync"
)

// outputCheck is pmirun's standard output or error as the job writes to
// it (the ranks' lines, pmirun's own messages). A write that fails (a
// full disk, /dev/full) is said at once on standard error, unless that
// is the failing stream, and makes a job that otherwise succeeded end
// with exit code 1: output lost is never silent. The job goes on (its
// other results may be files), and later writes are tried as they come.
// Writes are serialised: the failure is said on standard error from
// whichever goroutine met it, beside the job's other writers there.
type outputCheck struct {
	name string    // "standard output" or "standard error"
	say  io.Writer // where the failure is said; nil for standard error itself

	wmu sync.Mutex // held while writing to w
	w   io.Writer

	mu  sync.Mutex
	err error // the first failure
}

func (o *outputCheck) Write(p []byte) (int, error) {
	o.wmu.Lock()
	n, err := o.w.Write(p)
	o.wmu.Unlock()
	if err != nil {
		o.failed(err)
	}
	return n, err
}

func (o *outputCheck) failed(err error) {
	o.mu.Lock()
	first := o.err == nil
	if first {
		o.err = err
	}
	o.mu.Unlock()
	if first && o.say != nil {
		fmt.Fprintf(o.say, "pmirun: cannot write the job's %s (%v): the ranks' output is being lost\n", o.name, err)
	}
}

// failure is the first write error, or nil.
func (o *outputCheck) failure() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// checkOutputs puts an outputCheck in front of cfg's standard output and
// error. Its result is the verdict for a job that otherwise succeeded:
// nil, or a *JobError with exit code 1 when the job's output could not
// all be written.
func checkOutputs(cfg *Config) func() error {
	errs := &outputCheck{w: cfg.Stderr, name: "standard error"}
	outs := &outputCheck{w: cfg.Stdout, name: "standard output", say: errs}
	cfg.Stdout, cfg.Stderr = outs, errs
	return func() error {
		for _, o := range []*outputCheck{outs, errs} {
			if err := o.failure(); err != nil {
				return &JobError{Code: 1, Msg: fmt.Sprintf("cannot write the job's %s: %v", o.name, err)}
			}
		}
		return nil
	}
}
