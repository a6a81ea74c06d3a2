package launch

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
)

// The first failure decides the job, is printed once and ends it once; a
// rank that could not start, reported after it, is still said (why it
// could not start, a process limit, often explains the first failure)
// without changing the verdict; later failures are not printed.
func TestFateStartFailureAfterFailure(t *testing.T) {
	var out bytes.Buffer
	ends := 0
	f := &fate{stderr: &out, end: func(*JobError) { ends++ }}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 7, Code: 2, Msg: " before PMI init"})
	f.jobEvent(0, "", agent.Event{Kind: agent.EventStartFailed, Rank: 14, Msg: "fork/exec /bin/sh: resource temporarily unavailable"})
	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 8, Code: 2, Msg: " before PMI init"})
	if f.failure == nil || f.failure.Code != 2 || f.failure.Msg != "rank 7 exited with code 2 before PMI init" {
		t.Errorf("failure %+v, want rank 7's, code 2", f.failure)
	}
	if ends != 1 {
		t.Errorf("the job was ended %d times, want 1", ends)
	}
	want := "pmirun: rank 7 exited with code 2 before PMI init\n" +
		"pmirun: also, start rank 14: fork/exec /bin/sh: resource temporarily unavailable\n"
	if out.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A reason a rank could not start is said once, not again for each
// rank or node it stopped: a program missing on six nodes was said six
// times ('pmirun: also, start rank 3 on node 3 (h3): cannot run ...').
// Another reason is still said.
func TestFateStartFailureSaidOnce(t *testing.T) {
	var out bytes.Buffer
	f := &fate{stderr: &out, end: func(*JobError) {}}
	const missing = `cannot run "prog": executable file not found in $PATH`
	for i, node := range []string{"node 2 (h2)", "node 0 (h0)", "node 1 (h1)"} {
		f.jobEvent(0, node, agent.Event{Kind: agent.EventStartFailed, Rank: i, Code: 127, Msg: missing})
	}
	f.jobEvent(0, "node 3 (h3)", agent.Event{Kind: agent.EventStartFailed, Rank: 3, Code: 1, Msg: "fork/exec /bin/sh: resource temporarily unavailable"})
	want := "pmirun: start rank 0 on node 2 (h2): " + missing + "\n" +
		"pmirun: also, start rank 3 on node 3 (h3): fork/exec /bin/sh: resource temporarily unavailable\n"
	if out.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", out.String(), want)
	}
	if f.failure == nil || f.failure.Code != 127 {
		t.Errorf("failure %+v, want the first, code 127", f.failure)
	}
}

// A rank's abort message is printed on pmirun's own line as text: escape
// sequences, carriage returns and newlines (which could forge a
// "pmirun:" line) quoted, and at most maxAbortText bytes of it.
func TestAbortMessagePrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain: a=b; c":           "plain: a=b; c",
		"red \x1b[31mtext":        `red \x1b[31mtext`,
		"two\npmirun: forged\r":   `two\npmirun: forged\r`,
		"caf\xc3\xa9 ok":          "café ok",
		"bad \xff byte":           `bad \xff byte`,
		strings.Repeat("x", 5000): strings.Repeat("x", maxAbortText) + " [the first 4096 of 5000 bytes]",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%.40q) = %.60q, want %.60q", in, got, want)
		}
	}
}

// On a job of several nodes a rank's failure says where the rank ran:
// the node and its host, as the other messages name nodes ("node 1 (b)
// lost"); on one node there is no need to.
func TestFateNamesTheNode(t *testing.T) {
	for _, c := range []struct {
		jobno int
		where string
		e     agent.Event
		want  string
	}{
		{0, "node 1 (b)", agent.Event{Kind: agent.EventExited, Rank: 3, Code: 5, Msg: " before PMI init"}, "rank 3 on node 1 (b) exited with code 5 before PMI init"},
		{0, "node 2 (c)", agent.Event{Kind: agent.EventExited, Rank: 4, Sig: 9, Msg: " after PMI init, before finalize"}, "rank 4 on node 2 (c) killed by signal 9 (SIGKILL) after PMI init, before finalize"},
		{0, "node 1 (b)", agent.Event{Kind: agent.EventAbort, Rank: 1, Code: 7, Msg: "bye"}, "rank 1 on node 1 (b) called abort with exit code 7: bye"},
		{2, "node 0 (a)", agent.Event{Kind: agent.EventExited, Rank: 0, Fin: false, Spoke: true}, "job 2 rank 0 on node 0 (a) exited with code 0 without calling PMI finalize"},
		{0, "node 1 (b)", agent.Event{Kind: agent.EventProtocol, Rank: -1, Msg: "bad header"}, "PMI protocol error on node 1 (b): bad header"},
		{0, "", agent.Event{Kind: agent.EventExited, Rank: 3, Code: 5}, "rank 3 exited with code 5"},
	} {
		var out bytes.Buffer
		f := &fate{stderr: &out, end: func(*JobError) {}}
		f.jobEvent(c.jobno, c.where, c.e)
		if f.failure == nil || f.failure.Msg != c.want || out.String() != "pmirun: "+c.want+"\n" {
			t.Errorf("%+v from %q: failure %+v, stderr %q; want %q", c.e, c.where, f.failure, out.String(), c.want)
		}
	}
	// A rank that ended silently is named where it ran when another
	// rank's PMI makes that a failure.
	var out bytes.Buffer
	f := &fate{stderr: &out, end: func(*JobError) {}}
	f.jobEvent(0, "node 1 (b)", agent.Event{Kind: agent.EventExited, Rank: 2})
	f.jobEvent(0, "node 0 (a)", agent.Event{Kind: agent.EventInit, Rank: 0})
	if want := "rank 2 on node 1 (b) exited with code 0 before PMI init while other ranks use PMI"; f.failure == nil || f.failure.Msg != want {
		t.Errorf("failure %+v, want %q", f.failure, want)
	}
}

// A rank whose PMI connection closed before it spoke PMI, and which runs
// on, fails the job only once another rank uses PMI (Hydra ignores such a
// connection; the job failed at once); one that had spoken fails it at
// once.
func TestFateLostBeforePMI(t *testing.T) {
	var out bytes.Buffer
	f := &fate{stderr: &out, end: func(*JobError) {}}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventLost, Rank: 1})
	if f.failure != nil {
		t.Fatalf("a rank that never spoke PMI closing its connection failed the job: %+v", f.failure)
	}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventInit, Rank: 0})
	if want := "rank 1 closed its PMI connection before PMI init while other ranks use PMI"; f.failure == nil || f.failure.Msg != want {
		t.Errorf("failure %+v, want %q", f.failure, want)
	}
	out.Reset()
	f = &fate{stderr: &out, end: func(*JobError) {}}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventLost, Rank: 1, Spoke: true})
	if want := "rank 1 closed its PMI connection before finalize and kept running"; f.failure == nil || f.failure.Msg != want {
		t.Errorf("failure %+v, want %q", f.failure, want)
	}
}

// A run that spawns job after job keeps nothing of the jobs that are
// over: fate kept an entry for every job the run ever ran (about 100
// bytes each, 100 MB after a million spawns).
func TestFateForgetsEndedJobs(t *testing.T) {
	var out bytes.Buffer
	f := &fate{stderr: &out, end: func(*JobError) {}}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventInit})
	for jobno := 1; jobno <= 1000; jobno++ {
		f.jobEvent(jobno, "", agent.Event{Kind: agent.EventInit})
		f.jobEvent(jobno, "", agent.Event{Kind: agent.EventFinalized})
		f.jobEvent(jobno, "", agent.Event{Kind: agent.EventExited, Fin: true, Spoke: true})
		f.jobOver(jobno)
		f.jobEvent(jobno, "", agent.Event{Kind: agent.EventFinalized}) // a late report the fate ignores
	}
	if len(f.jobs) != 1 || f.failure != nil {
		t.Errorf("after 1000 spawned jobs ended fate tracks %d jobs (failure %v), want the first one only", len(f.jobs), f.failure)
	}
	// A job over is over: a silent rank of a job that never spoke, then
	// one of a new job that speaks, fail the new job only when it speaks.
	f.jobEvent(1001, "", agent.Event{Kind: agent.EventExited, Rank: 2})
	f.jobEvent(1001, "", agent.Event{Kind: agent.EventInit, Rank: 0})
	if f.failure == nil || !strings.Contains(f.failure.Msg, "job 1001 rank 2 exited with code 0 before PMI init") {
		t.Errorf("failure %+v, want job 1001 rank 2's silent exit", f.failure)
	}
}

// A non-zero exit after finalize is the job's outcome, said at once, but
// ends no rank: the others may still write their results. A failure
// after it still ends the job and decides its code; exits after
// finalize before a failure are said once.
func TestFateExitAfterFinalize(t *testing.T) {
	var out bytes.Buffer
	ends := 0
	f := &fate{stderr: &out, end: func(*JobError) { ends++ }}
	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 1, Code: 3, Spoke: true, Fin: true, Msg: " after PMI finalize"})
	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 2, Code: 4, Spoke: true, Fin: true, Msg: " after PMI finalize"})
	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 0, Spoke: true, Fin: true})
	if ends != 0 {
		t.Errorf("the job was ended %d times, want 0", ends)
	}
	if e := f.outcome(); e == nil || e.Code != 3 || e.Msg != "rank 1 exited with code 3 after PMI finalize" {
		t.Errorf("outcome %+v, want rank 1's, code 3", e)
	}
	if want := "pmirun: rank 1 exited with code 3 after PMI finalize\n"; out.String() != want {
		t.Errorf("stderr %q, want %q", out.String(), want)
	}

	f.jobEvent(0, "", agent.Event{Kind: agent.EventExited, Rank: 3, Sig: 11, Spoke: true, Fin: true, Msg: " after PMI finalize"})
	if ends != 1 {
		t.Errorf("a signal after finalize ended the job %d times, want 1", ends)
	}
	if e := f.outcome(); e == nil || e.Code != 139 {
		t.Errorf("outcome %+v, want the signal's, code 139", e)
	}
}
