package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
)

// JobError is the reason a job failed and the exit code pmirun returns.
type JobError struct {
	Code int
	Msg  string
}

func (e *JobError) Error() string { return e.Msg }

// ExitCode maps Run's error to a process exit code: 0 for nil, the job's
// code for a *JobError, 1 otherwise. A failure never maps to 0: a code
// outside 1..255 becomes 1.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var je *JobError
	if errors.As(err, &je) && je.Code >= 1 && je.Code <= 255 {
		return je.Code
	}
	return 1
}

// early reports a failure before any rank started.
func early(cfg Config, code int, msg string) error {
	if cfg.Stderr != nil {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", msg)
	}
	return &JobError{Code: code, Msg: msg}
}

// Run runs the job described by cfg and returns when every rank has been
// reaped. The error is nil when every rank succeeded; a *JobError carries
// the exit code and the reason otherwise. With cfg.ReportPath, the job's
// report is written last, whatever the outcome.
func Run(ctx context.Context, cfg Config) (jobErr error) {
	job := &jobOut{start: time.Now()}
	defer func() { job.write(&cfg, jobErr) }()
	if err := cfg.validate(); err != nil {
		return early(cfg, 2, err.Error())
	}
	if cfg.multiNode() {
		return runMulti(ctx, cfg, job)
	}
	rec := perf.NewRecorder()
	job.rec = rec
	ranks := make([]int, cfg.Size)
	for i := range ranks {
		ranks[i] = i
	}
	spec := cfg.spec([][]int{ranks}, BlockMapping(cfg.Size, 1, cfg.Size))
	if err := spec.Validate(); err != nil {
		return early(cfg, 2, err.Error())
	}
	var n *node.Node
	f := &fate{stderr: cfg.Stderr, end: func(*JobError) { n.Kill() }}
	n, err := node.New(spec, node.Options{Stdin: cfg.Stdin, Stdout: cfg.Stdout, Stderr: cfg.Stderr, Logger: cfg.Logger, Perf: rec, Emit: f.event})
	if err != nil {
		return early(cfg, 1, err.Error())
	}
	if err := n.Resolve(); err != nil {
		n.Close()
		return early(cfg, 127, err.Error())
	}
	n.Start()

	var timeout <-chan time.Time
	if cfg.Timeout > 0 {
		t := time.NewTimer(cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	for n.Live() > 0 {
		select {
		case ev := <-n.Events():
			n.Handle(ev)
		case sig := <-cfg.Signals:
			cfg.Logger.Info("forwarding signal to ranks", "signal", sig)
			n.Signal(sig)
		case <-timeout:
			timeout = nil
			f.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", cfg.Timeout)})
		case <-done:
			done = nil
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-n.KillTimer():
			n.KillNow()
		}
	}
	n.Close()
	report(cfg, rec)
	if f.failure != nil {
		return f.failure
	}
	return nil
}

// report prints the start-up summary and writes the trace.
func report(cfg Config, rec *perf.Recorder) {
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", rec.Summary(cfg.Size))
	}
	if cfg.TracePath != "" {
		if err := writeTrace(cfg.TracePath, rec); err != nil {
			fmt.Fprintf(cfg.Stderr, "pmirun: write trace: %v\n", err)
		}
	}
}

func writeTrace(path string, rec *perf.Recorder) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rec.WriteChromeTrace(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func signalName(sig int) string { return sys.SignalName(sig) }
