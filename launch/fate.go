package launch

import (
	"fmt"
	"io"

	"github.com/fastpmi/fastpmi/agent/node"
)

// fate decides how a job ends, from the events the nodes report. The
// first failure wins and is printed once; end is then called to stop
// every rank. It is used by one goroutine: Run's loop on one node, the
// root's loop across nodes.
type fate struct {
	stderr  io.Writer
	end     func(*JobError) // stop every rank
	failure *JobError

	anySpoke bool
	silent   []int // ranks that ended with code 0 before speaking PMI
}

func (f *fate) fail(e *JobError) {
	if f.failure != nil {
		return
	}
	f.failure = e
	fmt.Fprintf(f.stderr, "pmirun: %s\n", e.Msg)
	f.end(e)
}

// event applies one report about a rank.
func (f *fate) event(e node.Event) {
	switch e.Kind {
	case node.EvInit:
		f.anySpoke = true
		f.checkSilent()
	case node.EvExit:
		switch {
		case e.Sig != 0:
			f.fail(&JobError{Code: 128 + e.Sig, Msg: fmt.Sprintf("rank %d killed by signal %d (%s)%s", e.Rank, e.Sig, signalName(e.Sig), e.Msg)})
		case e.Code != 0:
			f.fail(&JobError{Code: e.Code, Msg: fmt.Sprintf("rank %d exited with code %d%s", e.Rank, e.Code, e.Msg)})
		case e.Fin:
		case e.Spoke:
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d exited with code 0 without calling PMI finalize", e.Rank)})
		default:
			f.silent = append(f.silent, e.Rank)
			f.checkSilent()
		}
	case node.EvLost:
		f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d closed its PMI connection before finalize and kept running", e.Rank)})
	case node.EvAbort:
		msg := fmt.Sprintf("rank %d called abort with exit code %d", e.Rank, e.Code)
		if e.Msg != "" {
			msg += ": " + e.Msg
		}
		f.fail(&JobError{Code: abortExitCode(e.Code), Msg: msg})
	case node.EvProtocol:
		if e.Rank < 0 { // no rank can be blamed (a connection not yet bound, the shared segment's header)
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("PMI protocol error: %s", e.Msg)})
			break
		}
		f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d sent malformed PMI: %s", e.Rank, e.Msg)})
	case node.EvStartErr:
		f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("start rank %d: %s", e.Rank, e.Msg)})
	}
}

// checkSilent fails the job once a rank has ended without PMI while others
// use it: they would wait for it forever.
func (f *fate) checkSilent() {
	if len(f.silent) == 0 || !f.anySpoke {
		return
	}
	f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("rank %d exited with code 0 before PMI init while other ranks use PMI", f.silent[0])})
}

// ExitAbortOutOfRange is pmirun's exit code for an abort whose code an exit
// status cannot carry as a failure: 0, negative, or 256 and beyond (the
// kernel keeps only the low 8 bits, so 256 would read as success). The
// message still names the code the rank gave.
const ExitAbortOutOfRange = 1

// abortExitCode is the exit code of a job aborted with code: code itself
// if it is 1..255, else ExitAbortOutOfRange.
func abortExitCode(code int) int {
	if code < 1 || code > 255 {
		return ExitAbortOutOfRange
	}
	return code
}
