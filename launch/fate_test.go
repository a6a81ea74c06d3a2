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
	f.jobEvent(0, agent.Event{Kind: agent.EventExited, Rank: 7, Code: 2, Msg: " before PMI init"})
	f.jobEvent(0, agent.Event{Kind: agent.EventStartFailed, Rank: 14, Msg: "fork/exec /bin/sh: resource temporarily unavailable"})
	f.jobEvent(0, agent.Event{Kind: agent.EventExited, Rank: 8, Code: 2, Msg: " before PMI init"})
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
