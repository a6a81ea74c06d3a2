package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// Slurm's libpmi2 (PMI-2 framing, job and node attributes, PMIX_Ring)
// under pmirun. pmi2_test checks everything inside each rank; here we
// check that every rank said so and what it saw of universeSize.
func TestPMI2(t *testing.T) {
	line := regexp.MustCompile(`^pmi2 ok rank (\d+) size (\d+) node 0 local (\d+)/(\d+) ring (\d+) usize (-?\d+)$`)
	for _, size := range []int{1, 2, 5, 16} {
		for _, usize := range []int{0, 32} {
			name := fmt.Sprintf("N=%d", size)
			args := []string{"-n", n(size)}
			wantUsize := -1 // unlimited when --usize is not given
			if usize != 0 {
				name += fmt.Sprintf("/usize=%d", usize)
				args = append(args, "--usize", n(usize))
				wantUsize = usize
			}
			t.Run(name, func(t *testing.T) {
				r := run(t, job{
					args:    append(args, prog("pmi2_test")),
					env:     []string{"EXPECT_USIZE=" + n(wantUsize), "PMI2_TEST_ALARM=30"},
					timeout: 60 * time.Second,
				})
				r.wantCode(t, 0)
				seen := make([]bool, size)
				for _, l := range lines(r.stdout) {
					m := line.FindStringSubmatch(l)
					if m == nil {
						t.Errorf("unexpected stdout line %q\n%s", l, r)
						continue
					}
					rank, _ := strconv.Atoi(m[1])
					if rank < 0 || rank >= size || seen[rank] {
						t.Errorf("rank %d reported twice or out of range\n%s", rank, r)
						continue
					}
					seen[rank] = true
					if m[2] != n(size) || m[3] != m[1] || m[4] != n(size) || m[6] != n(wantUsize) {
						t.Errorf("rank %d reported %q, want size %d, local rank %d of %d, usize %d", rank, l, size, rank, size, wantUsize)
					}
				}
				for rank, ok := range seen {
					if !ok {
						t.Errorf("rank %d did not report\n%s", rank, r)
					}
				}
			})
		}
	}
}

// The PMI-bound benchmark workload runs clean and silent.
func TestPMI2Bench(t *testing.T) {
	for _, size := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("N=%d", size), func(t *testing.T) {
			r := run(t, job{args: []string{"-n", n(size), prog("pmi2_bench")}})
			r.wantCode(t, 0)
			if r.stdout != "" || r.stderr != "" {
				t.Errorf("pmi2_bench is meant to be silent\n%s", r)
			}
		})
	}
}
