package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// --pmi-port works for every client kind: MPICH (PMI-1 initack with the
// PMI_ID token), Slurm's libpmi2 and the Go client (PMI-2 fullinit).
func TestPMIPortClients(t *testing.T) {
	r := run(t, job{args: []string{"--pmi-port", "-n", "3", prog("mpi_hello")}, env: []string{"FASTPMI_HELLO_VERBOSE=1"}})
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{"hello from rank 0 of 3": 1, "hello from rank 1 of 3": 1, "hello from rank 2 of 3": 1})
	r = run(t, job{args: []string{"--pmi-port", "-n", "3", prog("pmi2_test")}})
	r.wantCode(t, 0)
	r = run(t, job{args: []string{"--pmi-port", "--no-shm", "-n", "3", prog("hello")}})
	r.wantCode(t, 0)
}

// attack connects to the PMI port as user (a uid; "" for the test's own)
// and tries to become rank 0 with initack, as a stranger who knows PMI-1
// would; it returns what the agent answered.
func attack(t *testing.T, user, port string) (out string) {
	t.Helper()
	host, p, _ := strings.Cut(port, ":")
	script := `exec 3<>/dev/tcp/` + host + `/` + p + ` || exit 0
echo connected
printf 'cmd=initack pmiid=0\n' >&3
read -r -t 5 line <&3
echo "$line"`
	argv := []string{"bash", "-c", script}
	if user != "" {
		argv = append([]string{"setpriv", "--reuid=" + user, "--regid=" + user, "--clear-groups"}, argv...)
	}
	defer func() {
		if !strings.HasPrefix(out, "connected\n") {
			t.Errorf("attacker %v did not connect: %q", argv, out)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	out = string(b)
	if err != nil && ctx.Err() != nil {
		t.Fatalf("attacker %v did not end: %v\n%s", argv, err, out)
	}
	return out
}

// The PMI port is authenticated: a process of another user that connects
// first cannot bind as rank 0 (its socket's owner is checked), nor can a
// process of the job's user that guesses a rank number instead of the
// rank's PMI_ID token; the real ranks then run as if nothing happened.
func TestPMIPortAuthentication(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test changes user with setpriv and must run as root (make test does)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) not found: %v", err)
	}
	// Every rank says where the port is, waits for the attackers, then
	// runs MPI.
	rankScript := `echo "port=$PMI_PORT"; sleep 2; exec "$0"`
	j := start(t, job{
		args: []string{"--pmi-port", "-n", "2", "bash", "-c", rankScript, prog("mpi_hello")},
		env:  []string{"FASTPMI_HELLO_VERBOSE=1"}, timeout: 60 * time.Second,
	})
	var port string
	j.waitStdout(30*time.Second, func(ls []string) bool {
		for _, l := range ls {
			if p, ok := strings.CutPrefix(l, "port="); ok {
				port = p
				return true
			}
		}
		return false
	})
	if got := attack(t, "65534", port); strings.Contains(got, "rc=0") {
		t.Errorf("another user bound as rank 0: %q", got)
	}
	if got := attack(t, "", port); strings.Contains(got, "rc=0") || !strings.Contains(got, "pmiid_is_not_one_of_this_job's_PMI_ID_values") {
		t.Errorf("a guessed pmiid was answered %q, want a refusal", got)
	}
	r := j.wait()
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{"hello from rank 0 of 2": 1, "hello from rank 1 of 2": 1, "port=" + port: 2})
}
