package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Output forwarding, stdin, exit codes and signals, with plain commands as
// ranks (no PMI).

func TestLabel(t *testing.T) {
	for _, flag := range []string{"-l", "--label"} {
		t.Run(flag, func(t *testing.T) {
			r := run(t, job{args: []string{"-n", "3", flag, "sh", "-c", `echo line-$PMI_RANK; echo err-$PMI_RANK >&2`}})
			r.wantCode(t, 0)
			r.wantRankLines(t, 3, func(rank int) string { return fmt.Sprintf("[%d] line-%d", rank, rank) })
			errs := map[string]bool{}
			for _, l := range lines(r.stderr) {
				errs[l] = true
			}
			for rank := 0; rank < 3; rank++ {
				if l := fmt.Sprintf("[%d] err-%d", rank, rank); !errs[l] {
					t.Errorf("stderr lacks %q\n%s", l, r)
				}
			}
		})
	}
	// Without the flag lines are passed unchanged.
	r := run(t, job{args: []string{"-n", "2", "sh", "-c", `echo line-$PMI_RANK`}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 2, func(rank int) string { return fmt.Sprintf("line-%d", rank) })
}

// A last line without a newline still becomes a line of its own.
func TestUnterminatedLastLine(t *testing.T) {
	r := run(t, job{args: []string{"-n", "2", "sh", "-c", `printf tail-$PMI_RANK`}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 2, func(rank int) string { return fmt.Sprintf("tail-%d", rank) })
}

// floodAwk prints 1000 numbered lines per rank on stdout, of lengths from
// 20 bytes to 3 KB and four of 100 KB (more than a pipe holds), and every
// fourth one, shorter, on stderr. awk writes in 4 KB blocks, so lines
// reach pmirun cut at arbitrary places.
const floodAwk = `BEGIN {
	r = ENVIRON["PMI_RANK"]
	big = "x"; while (length(big) < 100000) big = big big
	for (i = 0; i < 1000; i++) {
		n = (i % 250 == 0) ? 100000 : 20 + (i * 97) % 3000
		s = sprintf("r%d-i%d-", r, i)
		print s substr(big, 1, n - length(s))
		if (i % 4 == 0) print "e" s substr(big, 1, 50 + i % 700) > "/dev/stderr"
	}
}
`

func floodLen(i int) int {
	if i%250 == 0 {
		return 100000
	}
	return 20 + (i*97)%3000
}

// Lines of different ranks never mix inside a line, on stdout or stderr,
// and each rank's lines keep their order.
func TestLinesIntact(t *testing.T) {
	script := filepath.Join(t.TempDir(), "flood.awk")
	if err := os.WriteFile(script, []byte(floodAwk), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		size  int
		label bool
	}{{4, false}, {2, true}} {
		t.Run(fmt.Sprintf("N=%d/label=%v", tc.size, tc.label), func(t *testing.T) {
			args := []string{"-n", n(tc.size)}
			if tc.label {
				args = append(args, "-l")
			}
			r := run(t, job{args: append(args, "awk", "-f", script), timeout: 120 * time.Second})
			r.wantCode(t, 0)
			checkFlood(t, r, lines(r.stdout), tc.size, tc.label, "r", func(i int) int { return floodLen(i) }, 1, 1000)
			var errLines []string
			for _, l := range lines(r.stderr) {
				if !strings.HasPrefix(l, "pmirun: ") {
					errLines = append(errLines, l)
				}
			}
			checkFlood(t, r, errLines, tc.size, tc.label, "er", func(i int) int {
				return len(fmt.Sprintf("er%d-i%d-", 0, i)) + 50 + i%700
			}, 4, 250)
		})
	}
}

// checkFlood checks that ls are exactly count lines per rank, in order,
// with indices 0, step, 2*step, ..., each "<prefix><rank>-i<i>-xxx" of
// length want(i) after the label (ranks have one digit).
func checkFlood(t *testing.T, r result, ls []string, size int, label bool, prefix string, want func(int) int, step, count int) {
	t.Helper()
	rx := regexp.MustCompile(`^` + prefix + `(\d+)-i(\d+)-(x*)$`)
	next := make([]int, size)
	for k, l := range ls {
		body := l
		labelRank := -1
		if label {
			m := regexp.MustCompile(`^\[(\d+)\] `).FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s line %d has no rank label: %.80q...", prefix, k, l)
			}
			labelRank, _ = strconv.Atoi(m[1])
			body = l[len(m[0]):]
		}
		m := rx.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s line %d is broken (%d bytes): %.80q ... %.80q\n(exit %d)", prefix, k, len(l), l, l[max(0, len(l)-80):], r.code)
		}
		rank, _ := strconv.Atoi(m[1])
		i, _ := strconv.Atoi(m[2])
		if rank >= size || (label && labelRank != rank) {
			t.Fatalf("%s line %d: rank %d under label %d: %.80q", prefix, k, rank, labelRank, l)
		}
		if i != next[rank]*step {
			t.Fatalf("%s line %d: rank %d line %d follows line %d", prefix, k, rank, i, (next[rank]-1)*step)
		}
		next[rank]++
		if wantLen := want(i); len(body) != wantLen {
			t.Fatalf("%s line %d (rank %d, line %d) is %d bytes, want %d", prefix, k, rank, i, len(body), wantLen)
		}
	}
	for rank, c := range next {
		if c != count {
			t.Errorf("rank %d printed %d %s-lines, want %d", rank, c, prefix, count)
		}
	}
}

// stdin goes to rank 0 only, to its end; the others read /dev/null.
func TestStdin(t *testing.T) {
	r := run(t, job{
		args:  []string{"-n", "2", "sh", "-c", `read x; echo "got:$PMI_RANK:$x"`},
		stdin: strings.NewReader("hello\nsecond line\n"),
	})
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{"got:0:hello": 1, "got:1:": 1})

	data := make([]byte, 1<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	r = run(t, job{
		args:  []string{"-n", "3", "sh", "-c", `if [ "$PMI_RANK" = 0 ]; then sha256sum; else echo "rank $PMI_RANK: $(wc -c)"; fi`},
		stdin: bytes.NewReader(data),
	})
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{hex.EncodeToString(sum[:]) + "  -": 1, "rank 1: 0": 1, "rank 2: 0": 1})
}

func TestExitCode(t *testing.T) {
	t.Run("all zero", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "4", "true"}})
		r.wantCode(t, 0)
		if m := r.pmirunLines(); len(m) > 0 {
			t.Errorf("pmirun complains about a job that succeeded\n%s", r)
		}
	})
	t.Run("either rank", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "2", "sh", "-c", `exit $((PMI_RANK+5))`}})
		if r.code != 5 && r.code != 6 {
			t.Fatalf("exit code %d, want 5 or 6\n%s", r.code, r)
		}
		r.wantMessage(t, fmt.Sprintf(`\brank %d exited with code %d\b`, r.code-5, r.code))
	})
	t.Run("first failure wins", func(t *testing.T) {
		// Rank 1 fails at once; the others would sleep 10 s and are ended
		// by pmirun, which must not count their SIGTERM as the failure.
		r := run(t, job{args: []string{"-n", "3", "sh", "-c", `if [ "$PMI_RANK" = 1 ]; then exit 5; fi; sleep 10`}})
		r.wantCode(t, 5)
		r.wantMessage(t, `\brank 1 exited with code 5\b`)
		r.wantFaster(t, 5*time.Second)
	})
	t.Run("killed by signal", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "2", "sh", "-c", `if [ "$PMI_RANK" = 1 ]; then kill -SEGV $$; fi; sleep 10`}})
		r.wantCode(t, 128+11)
		r.wantMessage(t, `\brank 1 killed by signal 11\b`)
		r.wantFaster(t, 5*time.Second)
	})
	t.Run("program not found", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "2", "/nonexistent/fastpmi-no-such-program"}})
		r.wantCode(t, 127)
	})
	t.Run("bad command line", func(t *testing.T) {
		for _, args := range [][]string{{"-n"}, {"-n", "two", "true"}, {"--no-such-flag", "true"}, {"-n", "2"}} {
			r := run(t, job{args: args})
			r.wantCode(t, 2)
		}
	})
}

// SIGINT, SIGTERM and SIGHUP sent to pmirun reach every rank, which traps
// it, says so and exits.
func TestSignalForwarding(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  os.Signal
	}{{"TERM", sys.SIGTERM}, {"INT", sys.SIGINT}, {"HUP", sys.SIGHUP}} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 3
			script := fmt.Sprintf(`trap 'echo got-%s-$PMI_RANK; exit 0' %s; echo ready-$PMI_RANK; while :; do sleep 0.1; done`, tc.name, tc.name)
			j := start(t, job{args: []string{"-n", n(size), "sh", "-c", script}, timeout: 30 * time.Second})
			j.waitStdout(20*time.Second, func(ls []string) bool { return len(ls) >= size })
			// The survivor check must see the live ranks, or it proves nothing.
			if got := marked(j.marker); len(got) < size {
				t.Errorf("found %d processes with the job's marker while %d ranks run: %s", len(got), size, describe(got))
			}
			sent := time.Now()
			if err := j.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			r := j.wait()
			t.Logf("pmirun ended %v after SIG%s with exit code %d", time.Since(sent).Round(time.Millisecond), tc.name, r.code)
			want := map[string]int{}
			for rank := 0; rank < size; rank++ {
				want[fmt.Sprintf("ready-%d", rank)] = 1
				want[fmt.Sprintf("got-%s-%d", tc.name, rank)] = 1
			}
			r.wantLines(t, want)
			r.wantFaster(t, 10*time.Second)
		})
	}
}
