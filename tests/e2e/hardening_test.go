package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A raw PMI-1 client in bash on PMI_FD: every rank inits; rank 0 aborts
// with the code given, the others sleep (pmirun must end them).
func abortScript(code string) string {
	return fmt.Sprintf(`printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD
read -r line <&$PMI_FD
if [ "$PMI_RANK" = 0 ]; then printf 'cmd=abort exitcode=%s\n' >&$PMI_FD; fi
sleep 20`, code)
}

// An abort's exit code is never 0: codes a process exit status cannot hold
// as a failure (0, negative, 256 and beyond, which the kernel would
// truncate to 0..255) become launch.ExitAbortOutOfRange (1), on one node
// and with agents; codes 1..255
// are kept.
func TestAbortExitCode(t *testing.T) {
	for _, tc := range []struct {
		code string
		want int
		boot []string
	}{
		{"0", 1, nil}, {"256", 1, nil}, {"512", 1, nil}, {"-1", 1, nil}, {"255", 255, nil}, {"3", 3, nil},
		{"0", 1, []string{"--bootstrap", "loopback", "--nodes", "2"}},
		{"256", 1, []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.code+strings.Join(tc.boot, ""), func(t *testing.T) {
			args := append(append([]string{}, tc.boot...), "-n", "2", "bash", "-c", abortScript(tc.code))
			r := run(t, job{args: args, timeout: 30 * time.Second})
			r.wantCode(t, tc.want)
			r.wantMessage(t, fmt.Sprintf(`\brank 0 called abort with exit code %s\b`, tc.code))
			r.wantFaster(t, 10*time.Second)
		})
	}
}
