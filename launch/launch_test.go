package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
)

func TestBlockMapping(t *testing.T) {
	for _, tc := range []struct {
		size, nodes, ppn int
		want             string
	}{
		{1, 1, 1, "(vector,(0,1,1))"},
		{8, 1, 8, "(vector,(0,1,8))"},
		{8, 2, 4, "(vector,(0,2,4))"},
		{10, 3, 4, "(vector,(0,2,4),(2,1,2))"},
		{0, 1, 1, ""},
	} {
		if got := BlockMapping(tc.size, tc.nodes, tc.ppn); got != tc.want {
			t.Errorf("BlockMapping(%d,%d,%d) = %q, want %q", tc.size, tc.nodes, tc.ppn, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Size: -1, Prog: "true"},
		{Size: 1},
		{Size: 1, Prog: "true", Env: []string{"novalue"}},
		{Size: 1, Prog: "true", Timeout: -time.Second},
		{Size: 1, Prog: "true", UniverseSize: -5},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("validate(%+v) accepted a bad config", c)
		}
	}
}

func TestRunNotFound(t *testing.T) {
	var stderr bytes.Buffer
	err := Run(context.Background(), Config{Size: 2, Prog: "/nonexistent/prog", Stderr: &stderr})
	var je *JobError
	if !errors.As(err, &je) || je.Code != 127 {
		t.Fatalf("err = %v, want exit 127", err)
	}
	if !strings.Contains(stderr.String(), "/nonexistent/prog") {
		t.Fatalf("stderr %q does not name the program", stderr.String())
	}
}

// Output lines of many ranks never interleave inside a line, and labels
// name the rank.
func TestOutputWholeLines(t *testing.T) {
	var stdout, stderr bytes.Buffer
	line := strings.Repeat("x", 3000)
	err := Run(context.Background(), Config{
		Size: 4, Prog: "sh", Label: true, Stdout: &stdout, Stderr: &stderr,
		Args: []string{"-c", `i=0; while [ $i -lt 50 ]; do echo "r$PMI_RANK ` + line + `"; i=$((i+1)); done; printf tail$PMI_RANK`},
	})
	if err != nil {
		t.Fatalf("run: %v (stderr %s)", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(lines) != 4*51 {
		t.Fatalf("%d lines, want %d", len(lines), 4*51)
	}
	for _, l := range lines {
		var r int
		if strings.Contains(l, "] tail") {
			continue
		}
		if n, _ := fmt.Sscanf(l, "[%d]", &r); n != 1 || l != "["+strconv.Itoa(r)+"] r"+strconv.Itoa(r)+" "+line {
			t.Fatalf("mangled line (%d bytes): %.80q", len(l), l)
		}
	}
}

// --timeout ends a job whose output nobody reads (pmirun | less, left
// waiting; a terminal stopped with Ctrl-S) within its bound, and says
// why the output stopped. Before, pmirun waited for the stalled write
// as long as its reader lived: exit 141 once it went, never 124.
func TestTimeoutStdoutStalled(t *testing.T) {
	unblock := make(chan struct{})
	defer close(unblock)
	var stderr syncbuf.Buffer
	ran := make(chan error, 1)
	go func() {
		ran <- Run(context.Background(), Config{Size: 2, Prog: "yes", Timeout: time.Second, Stdout: stalledWriter(unblock), Stderr: &stderr})
	}()
	var err error
	select {
	case err = <-ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("the job still runs 10 s after its 1s timeout\nstderr:\n%s", stderr.String())
	}
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitTimeout {
		t.Fatalf("run: %v, want a job error of code %d\nstderr:\n%s", err, ExitTimeout, stderr.String())
	}
	if want := "pmirun: stopped forwarding the ranks' output: its stdout took none of it for 2s\n"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr:\n%s\nwant %q", stderr.String(), want)
	}
}

// stalledWriter is a stream nobody reads: a Write blocks until the
// channel is closed.
type stalledWriter chan struct{}

func (w stalledWriter) Write(p []byte) (int, error) {
	<-w
	return len(p), nil
}

func TestStdinToRankZero(t *testing.T) {
	var stdout bytes.Buffer
	err := Run(context.Background(), Config{
		Size: 2, Prog: "sh", Stdout: &stdout, Stdin: strings.NewReader("hello\n"),
		Args: []string{"-c", `read x; echo "$PMI_RANK:$x"`},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := stdout.String()
	if !strings.Contains(got, "0:hello\n") || !strings.Contains(got, "1:\n") {
		t.Fatalf("stdout %q", got)
	}
}

func TestFirstFailingExitCode(t *testing.T) {
	var stderr bytes.Buffer
	err := Run(context.Background(), Config{
		Size: 3, Prog: "sh", Stderr: &stderr,
		Args: []string{"-c", `if [ $PMI_RANK = 2 ]; then exit 9; fi; sleep 20`},
	})
	if ExitCode(err) != 9 {
		t.Fatalf("exit code %d (%v), want 9", ExitCode(err), err)
	}
	if !strings.Contains(stderr.String(), "rank 2 exited with code 9 before PMI init") {
		t.Fatalf("stderr %q", stderr.String())
	}
	err = Run(context.Background(), Config{Size: 2, Prog: "sh", Stderr: &stderr,
		Args: []string{"-c", `if [ $PMI_RANK = 1 ]; then kill -SEGV $$; fi; sleep 20`}})
	if ExitCode(err) != 128+11 {
		t.Fatalf("exit code %d (%v), want 139", ExitCode(err), err)
	}
	if !strings.Contains(stderr.String(), "rank 1 killed by signal 11 (SIGSEGV)") {
		t.Fatalf("stderr %q", stderr.String())
	}
}

func TestNoPMIProgramsSucceed(t *testing.T) {
	if err := Run(context.Background(), Config{Size: 4, Prog: "true", Stdout: os.Stdout}); err != nil {
		t.Fatal(err)
	}
}
