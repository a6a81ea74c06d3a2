package client_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/launch"
)

// Every test below starts real jobs: launch.Run with the agent in this
// process and the ranks as processes of this test binary (see TestMain),
// over shared memory, over PMI-2 text (NoShm), and mixed (odd ranks drop
// FASTPMI_SHM_FD and speak text to the agent the even ranks reach through
// shared memory: one KVS, one epoch sequence for both).

func TestAllgather(t *testing.T) { forEach(t, "allgather", 1, 2, 5, 16) }

func TestNonBlocking(t *testing.T) { forEach(t, "nonblocking", 1, 4) }

func TestManyOutstanding(t *testing.T) { forEach(t, "outstanding", 1, 3) }

func TestEpochsAlternate(t *testing.T) { forEach(t, "epochs", 3) }

// TestValuesLifetime checks the documented lifetime of a Values view: it
// stays valid while this rank starts one more collective (here a fence)
// after the one that produced it.
func TestValuesLifetime(t *testing.T) { forEach(t, "lifetime", 2) }

func TestRing(t *testing.T) { forEach(t, "ring", 1, 3, 8) }

func TestPutFenceGet(t *testing.T) { forEach(t, "kvs", 1, 5) }

func TestWaitForPut(t *testing.T) { forEach(t, "waitget", 3) }

func TestFenceAfterFailedEpoch(t *testing.T) { forEach(t, "skipfailed", 3) }

func TestMisuse(t *testing.T) { forEach(t, "misuse", 1, 3) }

func TestPublishLookup(t *testing.T) { forEach(t, "names", 3) }

func TestNodeAttr(t *testing.T) { forEach(t, "nodeattr", 1, 3) }

func TestJobAttr(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			job{scenario: "jobattr", n: 3, transport: tr.name, universe: jobUniverse}.runOK(t)
		})
	}
}

func TestLimitsAndFinalize(t *testing.T) { forEach(t, "limits", 2) }

// TestHeldBounded: what a client holds of its collectives stays bounded
// however many it runs.
func TestHeldBounded(t *testing.T) { forEach(t, "held", 1, 3) }

// TestSingleton runs a rank with no launcher environment at all: the
// singleton scenario, and those of the others a singleton must pass too
// (allgathers outstanding, each result its own; misuse; what it holds
// of its collectives stays bounded; names).
func TestSingleton(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, scenario := range []string{"singleton", "outstanding", "misuse", "held", "names"} {
		cmd := exec.Command(exe)
		cmd.Env = append(launcherless(), envScenario+"="+scenario, envTransport+"=singleton")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s as a singleton: %v\n%s", scenario, err, out)
		}
	}
}

// launcherless is this process's environment without any launcher's
// variables, for a rank started by the test itself.
func launcherless() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "PMIX_") || strings.HasPrefix(k, "MPI_") || k == "FASTPMI_SHM_FD" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TestInitBadEnvironment: a launcher variable naming a descriptor that is
// not what it says fails Init with an error naming the variable.
func TestInitBadEnvironment(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	regular, err := os.CreateTemp(t.TempDir(), "not-a-segment")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	if _, err := regular.WriteString("not a segment\n"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		env   string
		extra *os.File // the child's descriptor 3
		want  string
	}{
		{"shm fd a regular file", "FASTPMI_SHM_FD=3", regular, "init: FASTPMI_SHM_FD=3: map segment: file of 14 bytes cannot hold a segment"},
		{"shm fd closed", "FASTPMI_SHM_FD=999", nil, "init: FASTPMI_SHM_FD=999: duplicate descriptor 999: bad file descriptor"},
		{"shm fd no number", "FASTPMI_SHM_FD=x", nil, `init: read FASTPMI_SHM_FD="x": not a descriptor`},
		{"pmi fd a regular file", "PMI_FD=3", regular, "init: PMI_FD=3: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(exe)
			cmd.Env = append(launcherless(), envScenario+"=kvs", envTransport+"=shm", "PMI_RANK=0", "PMI_SIZE=1", "MPI_LOCALRANKID=0", c.env)
			if c.extra != nil {
				cmd.ExtraFiles = []*os.File{c.extra}
			}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) {
				t.Errorf("%s: %v, want a failed Init saying %q\n%s", c.env, err, c.want, out)
			}
		})
	}
}

// TestInitSilentLauncher: a launcher that never answers PMI-2's init
// fails Init after its 30 s bound with an error saying so, where it said
// only "PMI-2 init: context deadline exceeded".
func TestInitSilentLauncher(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for Init's 30 s bound")
	}
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "launcher"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	silent, err := l.Accept() // never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	f, err := conn.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(launcherless(), envScenario+"=kvs", envTransport+"=text", "PMI_FD=3")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if want := "init: PMI-2 init: no answer on PMI_FD=3 in 30s"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("%v, want a failed Init saying %q\n%s", err, want, out)
	}
}

// TestInitLeavesStrayDescriptors: a launcher variable naming a
// descriptor that is not what it says (inherited by a process a rank
// started, it names a file that process opened) fails Init and leaves
// the descriptor the program's; Init closed it. Such an Init takes
// nothing, so another may try again.
func TestInitLeavesStrayDescriptors(t *testing.T) {
	for _, v := range []string{"FASTPMI_SHM_FD", "PMI_FD"} {
		t.Run(v, func(t *testing.T) {
			f, err := os.CreateTemp(t.TempDir(), "the-program's")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			client.ForgetLauncher()
			t.Cleanup(client.ForgetLauncher)
			t.Setenv(v, strconv.Itoa(int(f.Fd())))
			if _, err := client.Init(); err == nil {
				t.Fatalf("Init with %s naming a regular file succeeded", v)
			}
			if _, err := f.WriteString("still the program's\n"); err != nil {
				t.Errorf("the program's file after a failed Init: %v", err)
			}
			// Nothing was taken: a second Init tries again (it said
			// ErrInitialized, though no Init had succeeded).
			if _, err := client.Init(); err == nil || errors.Is(err, client.ErrInitialized) {
				t.Errorf("a second Init after one that took nothing: %v, want its own failure", err)
			}
		})
	}
}

// TestAbort: one rank's Abort(5, "x") ends the job with exit code 5 while
// the others wait in a fence.
func TestAbort(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t0 := time.Now()
			out, err := job{scenario: "abort", n: 3, transport: tr.name}.run(t)
			if code := launch.ExitCode(err); code != abortCode {
				t.Fatalf("exit code %d (%v), want %d\n%s", code, err, abortCode, out)
			}
			if !strings.Contains(err.Error(), "abort") || !strings.Contains(err.Error(), "rank 1") {
				t.Errorf("job error %q does not name rank 1's abort", err)
			}
			if d := time.Since(t0); d > rankTimeout/2 {
				t.Errorf("abort took %v to end the job", d)
			}
		})
	}
}
