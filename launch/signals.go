package launch

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// InterruptWindow is how soon a second SIGINT (Ctrl-C) must follow the
// first to kill every rank instead of being forwarded.
const InterruptWindow = 5 * time.Second

// interrupts escalates repeated Ctrl-C: the first SIGINT is forwarded to
// the ranks (they may clean up or ignore it) with a note saying so; a
// second within InterruptWindow ends the job, killing every rank. Used by
// the one goroutine that runs the job's loop.
type interrupts struct {
	stderr io.Writer
	last   time.Time // the last forwarded SIGINT; zero = none
}

// kill reports whether sig is a second SIGINT within the window (end the
// job); otherwise the caller forwards sig.
func (in *interrupts) kill(sig os.Signal) bool {
	if sig != sys.SIGINT {
		return false
	}
	now := time.Now()
	if !in.last.IsZero() && now.Sub(in.last) < InterruptWindow {
		return true
	}
	in.last = now
	fmt.Fprintf(in.stderr, "pmirun: SIGINT forwarded to every rank; press Ctrl-C again within %v to kill them\n", InterruptWindow)
	return false
}

// interruptError ends a job on a second Ctrl-C: exit 130, as a shell
// reports a job killed by SIGINT.
func interruptError() *JobError {
	return &JobError{Code: 128 + sys.SignalNumber(sys.SIGINT), Msg: "interrupted twice: killing every rank"}
}
