package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/jobreport"
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
		if errors.As(err, new(reportPathError)) {
			cfg.ReportPath = "" // refused: nothing to write there
		}
		return early(cfg, 2, err.Error())
	}
	if f, ok := cfg.Stdout.(*os.File); ok && sys.IsTerminal(f) {
		cfg.interactive = true
	}
	outputs := checkOutputs(&cfg)
	defer func() {
		if jobErr == nil {
			jobErr = outputs()
		}
	}()
	if cfg.Verbose && cfg.mpiFound != "" {
		fmt.Fprintf(cfg.Stderr, "pmirun: --mpi %s\n", cfg.mpiFound)
	}
	if cfg.multiNode() {
		return runMulti(ctx, cfg, job)
	}
	return runFork(ctx, cfg, job)
}

// report prints the start-up summary and writes the trace.
func report(cfg Config, rec *perf.Recorder) {
	if cfg.Verbose {
		fmt.Fprintf(cfg.Stderr, "pmirun: %s\n", rec.Summary(cfg.Size))
	}
	if cfg.TracePath != "" {
		if err := jobreport.WriteOut(cfg.TracePath, rec.WriteChromeTrace); err != nil {
			fmt.Fprintf(cfg.Stderr, "pmirun: write trace %s: %v\n", cfg.TracePath, err)
		}
	}
}

func signalName(sig int) string { return sys.SignalName(sig) }
