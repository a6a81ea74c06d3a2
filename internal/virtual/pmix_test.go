package virtual

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
)

// A node's packed data unpacks to each rank's, nodes concatenated in any
// order of ranks; clients without data are left out, and an empty value
// is kept apart from no value.
func TestPackUnpack(t *testing.T) {
	a := packNode([]int{0, 1, 2}, [][]byte{[]byte("zero"), nil, {}})
	b := packNode([]int{3, 5}, [][]byte{[]byte("three"), []byte("five=5")})
	store, err := unpackJob(append(a, b...), 6)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"zero", "<nil>", "", "three", "<nil>", "five=5"}
	for r, w := range want {
		got := string(store[r])
		if store[r] == nil {
			got = "<nil>"
		}
		if got != w {
			t.Errorf("rank %d: %q, want %q", r, got, w)
		}
	}
	if len(packNode([]int{0, 1}, [][]byte{nil, nil})) != 0 {
		t.Error("a fence without data packs some")
	}
	if s, err := unpackJob(nil, 2); err != nil || s[0] != nil || s[1] != nil {
		t.Errorf("nothing unpacks to %q, %v", s, err)
	}
}

// Data that does not unpack is refused, never read out of bounds.
func TestUnpackRejects(t *testing.T) {
	good := packNode([]int{1}, [][]byte{[]byte("abc")})
	for _, c := range []struct {
		name string
		b    []byte
		size int
		err  string
	}{
		{"rank beyond the job", good, 1, "rank 1 in a job of 1"},
		{"truncated header", good[:5], 2, "5 bytes left"},
		{"truncated value", good[:len(good)-1], 2, "has 3 bytes, 2 left"},
		{"rank twice", append(good, good...), 2, "rank 1 twice"},
		{"huge length", []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, 2, "has 4294967295 bytes"},
	} {
		if _, err := unpackJob(c.b, c.size); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.err)
		}
	}
}

// The played server against a real agent on one node: every client
// connects, runs fences of the pmix-fence workload and one of stamps, and
// finalizes; the agent sees one allgather epoch per fence and every rank
// finalized.
func TestPlayedServer(t *testing.T) {
	const ranks, rounds = 5, 4
	local := []int{0, 1, 2, 3, 4}
	ag, err := agent.New(agent.Config{JobID: "job-1", Size: ranks, Local: local, Upstream: agent.NewLocal()})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	srv, err := newPlayedServer(ag, local, ranks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newPlayedServer(ag, local, ranks); err == nil {
		t.Error("a second front end attached to one agent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for i := range ranks {
		wg.Go(func() {
			p, err := srv.connect(i)
			if err != nil {
				errs[i] = err
				return
			}
			for r := range rounds {
				if err := pmixFenceRound(ctx, p, r, func() {}); err != nil {
					errs[i] = fmt.Errorf("round %d: %w", r, err)
					return
				}
			}
			if err := p.Barrier(ctx); err != nil {
				errs[i] = err
				return
			}
			vals, err := p.Allgather(ctx, []byte{byte(i)})
			switch {
			case err != nil:
				errs[i] = err
			case vals.Len() != ranks:
				errs[i] = fmt.Errorf("allgather of %d ranks", vals.Len())
			default:
				for r := range ranks {
					if v := vals.At(r); len(v) != 1 || v[0] != byte(r) {
						errs[i] = fmt.Errorf("allgather: rank %d's value %v", r, v)
					}
				}
			}
			if err := p.Finalize(); err != nil && errs[i] == nil {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	if st := ag.Stats(); st.Finished != ranks {
		t.Errorf("%d ranks finalized, want %d", st.Finished, ranks)
	}
	for r := range ranks {
		if spoke, fin := ag.RankStatus(r); !spoke || !fin {
			t.Errorf("rank %d: spoke %v, finalized %v", r, spoke, fin)
		}
	}
}

// A client whose context ends while it waits for the others returns.
func TestPlayedFenceCancel(t *testing.T) {
	ag, err := agent.New(agent.Config{JobID: "job-1", Size: 2, Local: []int{0, 1}, Upstream: agent.NewLocal()})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	srv, err := newPlayedServer(ag, []int{0, 1}, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := srv.fence(ctx, 0, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fence without the other client: %v", err)
	}
	if _, err := srv.fence(ctx, 0, []byte("x")); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second entry into one fence: %v", err)
	}
}
