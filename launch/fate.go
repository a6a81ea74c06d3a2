package launch

import (
	"fmt"
	"io"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/fastpmi/fastpmi/agent"
)

// fate decides how a job ends, from the events the nodes report. The
// first failure wins and is printed once; end is then called to stop
// every rank. A rank that exits with a non-zero code after finalize
// fails the job without ending it (afterFin): the other ranks, no longer
// in MPI, may still be writing their results, and Hydra lets them
// finish too; what the ranks left behind is then left as a job that
// succeeds leaves it. It is used by one goroutine: Run's loop on one
// node, the root's loop across nodes.
type fate struct {
	stderr  io.Writer
	end     func(*JobError) // stop every rank
	failure *JobError
	// afterFin is the first non-zero exit after finalize, printed when
	// it came: the job's outcome unless a failure ended the job.
	afterFin *JobError

	jobs map[int]*jobFate // by Spec.Jobno, while the job runs (jobOver); nil until the first event
	// startWhy holds why ranks could not start, as said: a reason is said
	// once, not again for each rank or node it stopped (every node's
	// agent reports a program missing). Nil until the first.
	startWhy map[string]bool
}

// jobFate is what fate tracks of one job (the command line's, or one
// spawned).
type jobFate struct {
	anySpoke bool
	// silent names each rank that was done with PMI before it spoke it,
	// and how ("rank 2 exited with code 0", "rank 3 closed its PMI
	// connection"): a failure once another rank speaks PMI, nothing
	// before.
	silent []string
}

func (f *fate) fail(e *JobError) {
	if f.failure != nil {
		return
	}
	f.failure = e
	fmt.Fprintf(f.stderr, "pmirun: %s\n", e.Msg)
	f.end(e)
}

// job is what fate tracks of job jobno, made by the first event that
// needs it.
func (f *fate) job(jobno int) *jobFate {
	j := f.jobs[jobno]
	if j == nil {
		if f.jobs == nil {
			f.jobs = make(map[int]*jobFate)
		}
		j = new(jobFate)
		f.jobs[jobno] = j
	}
	return j
}

// jobOver forgets job jobno, all of whose ranks have ended: nothing it
// reports later can change its fate, and a run spawning thousands of
// jobs would keep every one's.
func (f *fate) jobOver(jobno int) { delete(f.jobs, jobno) }

// failAfterFin records e, a rank's non-zero exit after finalize, as the
// job's outcome if it is the first failure of any kind, and ends nothing.
func (f *fate) failAfterFin(e *JobError) {
	if f.failure != nil || f.afterFin != nil {
		return
	}
	f.afterFin = e
	fmt.Fprintf(f.stderr, "pmirun: %s\n", e.Msg)
}

// outcome is the job's failure, or nil if it succeeded: the failure that
// ended it, else a rank's non-zero exit after finalize.
func (f *fate) outcome() *JobError {
	if f.failure != nil {
		return f.failure
	}
	return f.afterFin
}

// rankName names rank r of job jobno in messages: "rank 3", or "job 1
// rank 3" for a spawned job, then where it runs, if the job has several
// nodes ("rank 3 on node 1 (n2)").
func rankName(jobno, r int, where string) string {
	name := fmt.Sprintf("rank %d", r)
	if jobno != 0 {
		name = fmt.Sprintf("job %d rank %d", jobno, r)
	}
	if where != "" {
		name += " on " + where
	}
	return name
}

// jobEvent applies one report about a rank of job jobno from the node
// where names ("" for a job on one node: no need to say).
func (f *fate) jobEvent(jobno int, where string, e agent.Event) {
	rank := rankName(jobno, e.Rank, where)
	switch e.Kind {
	case agent.EventInit:
		j := f.job(jobno)
		j.anySpoke = true
		f.checkSilent(j)
	case agent.EventExited:
		switch {
		case e.Sig != 0:
			f.fail(&JobError{Code: 128 + e.Sig, Msg: fmt.Sprintf("%s killed by signal %d (%s)%s", rank, e.Sig, signalName(e.Sig), e.Msg)})
		case e.Code != 0 && e.Fin:
			f.failAfterFin(&JobError{Code: e.Code, Msg: fmt.Sprintf("%s exited with code %d%s", rank, e.Code, e.Msg)})
		case e.Code != 0:
			f.fail(&JobError{Code: e.Code, Msg: fmt.Sprintf("%s exited with code %d%s", rank, e.Code, e.Msg)})
		case e.Fin:
		case e.Spoke:
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s exited with code 0 without calling PMI finalize", rank)})
		default:
			j := f.job(jobno)
			j.silent = append(j.silent, rank+" exited with code 0")
			f.checkSilent(j)
		}
	case agent.EventLost:
		if !e.Spoke {
			// As Hydra, a connection that never spoke PMI may close (a
			// program that is no MPI program closing what it inherited);
			// the rank is lost only to ranks that use PMI.
			j := f.job(jobno)
			j.silent = append(j.silent, rank+" closed its PMI connection")
			f.checkSilent(j)
			break
		}
		f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s closed its PMI connection before finalize and kept running", rank)})
	case agent.EventAbort:
		msg := fmt.Sprintf("%s called abort with exit code %d", rank, e.Code)
		if e.Msg != "" {
			msg += ": " + printable(e.Msg)
		}
		f.fail(&JobError{Code: abortExitCode(e.Code), Msg: msg})
	case agent.EventEnded:
		code := e.Code
		if code == 0 {
			code = 1
		}
		f.fail(&JobError{Code: code, Msg: fmt.Sprintf("%s: %s", rank, printable(e.Msg))})
	case agent.EventProtocol:
		if e.Rank < 0 { // no rank can be blamed (a connection not yet bound, the shared segment's header)
			at := ""
			if where != "" {
				at = " on " + where
			}
			f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("PMI protocol error%s: %s", at, e.Msg)})
			break
		}
		f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s broke the PMI protocol: %s", rank, e.Msg)})
	case agent.EventStartFailed:
		code := e.Code
		if code == 0 {
			code = 1
		}
		msg := fmt.Sprintf("start %s: %s", rank, e.Msg)
		said := f.startWhy[e.Msg]
		if f.startWhy == nil {
			f.startWhy = make(map[string]bool)
		}
		f.startWhy[e.Msg] = true
		if f.failure != nil {
			// Said even so: why a rank could not start (a process
			// limit, say) often explains the failure reported first.
			if !said {
				fmt.Fprintf(f.stderr, "pmirun: also, %s\n", msg)
			}
			return
		}
		f.fail(&JobError{Code: code, Msg: msg})
	}
}

// checkSilent fails the job once a rank has ended without PMI while others
// use it: they would wait for it forever.
func (f *fate) checkSilent(j *jobFate) {
	if len(j.silent) == 0 || !j.anySpoke {
		return
	}
	f.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s before PMI init while other ranks use PMI", j.silent[0])})
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

// maxAbortText bounds the part of a rank's abort message pmirun prints.
const maxAbortText = 4096

// printable is a rank's text as pmirun prints it on its own lines: control
// characters (escape sequences, carriage returns, newlines that would
// forge a "pmirun:" line) and invalid UTF-8 quoted as Go escapes, and at
// most maxAbortText bytes of it.
func printable(s string) string {
	n := len(s)
	if n > maxAbortText {
		s = s[:maxAbortText]
	}
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if !clean {
		q := strconv.Quote(s)
		s = q[1 : len(q)-1]
	}
	if n > maxAbortText {
		s += fmt.Sprintf(" [the first %d of %d bytes]", maxAbortText, n)
	}
	return s
}
