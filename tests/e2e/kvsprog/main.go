// Command kvsprog is an e2e test rank for the on-demand KVS: one access
// pattern per run, checked by every rank.
//
//	kvsprog -pattern P [-hint none|dense|sparse] [-fence] [-src]
//
// Patterns:
//
//	neighbours  every rank puts its key, then gets its two rank-space
//	            neighbours' keys (the research's sparse pattern)
//	bcast       rank 0 puts one key, every rank gets it (the dense pattern)
//	late        after a barrier, the last rank puts its key 300 ms after the others asked
//	            for it with a waiting get (a get before its put)
//	stale       rank 0 puts a key, everyone reads it; after a fence rank 0
//	            puts it again: everyone must read the new value
//	late-die    as late, but the last rank exits with code 3 instead of
//	            putting
//	deadlock    every rank waits for a key nobody puts: the job must end
//	            as a deadlock
//	missing     a get without wait of a key nobody puts is "not found" at
//	            once, on every node
//	skipfence   the odd ranks finalize at once; the even ones fence,
//	            which can never complete: under --cyclic on two nodes the
//	            job must end as a deadlock naming the node whose ranks
//	            ended without the fence
//	detached    one node: the last rank starts an Iallgather, works 300 ms
//	            and then puts the key the others wait for (it is not stuck:
//	            it never waited); its Ifence's Wait and a waiting Get cut
//	            short by 50 ms contexts, it works again and puts a second
//	            key the others ask for 1 s later; then it waits in an Ifence while the
//	            others wait for a key nobody puts, which every rank must
//	            see fail as a deadlock
//	edges       every rank puts a 1024-byte value, a 64-byte key and a
//	            value holding a ';'; after a fence each rank reads its
//	            right neighbour's, every one either refused by Put (the
//	            value with ErrTooLarge) or read back as it was put; rank 0
//	            prints "kvsprog edges: value1024=kept|refused key64=...
//	            semicolon=..."
//	abort       the last rank aborts the job with code 7; the others
//	            wait, making no PMI call, until the job ends (a get
//	            Hydra's mpiexec is asked while it cleans up after the
//	            abort fails its own assertion, exit 255)
//	local       every rank prints "kvsprog local: rank R local L of N"
//	            (Info's LocalRank and LocalSize)
//	names       a lookup and an unpublish of a name nobody published
//	            fail with ErrNotFound
//	unfenced    before any fence, every rank gets its right neighbour's
//	            key without waiting, then with WaitForPut (50 ms): each
//	            either not found (the first), cut short or ended by
//	            fastpmi's deadlock check (the second, every rank waiting)
//	            or refused with the client's reason ("fence first": under
//	            Hydra, whose PMI-2 server ends the job on a get before
//	            the rank's first fence); rank 0 prints "kvsprog
//	            unfenced: get=not-found|refused
//	            wait=cut-short|deadlock|refused"
//	finalize    every rank starts an Iallgather and an Ifence and
//	            finalizes without waiting for them (the last rank 300 ms
//	            late, so that the others' finalize comes first), then
//	            waits for both and checks the allgather's values
//
// With -fence the ranks fence between their puts and gets (PMI's
// put/fence/get); without it they get with WaitForPut (fence-less). With
// -src gets name the rank that put the key (client.FromRank). Rank 0
// prints one line; a mismatch goes to stderr and exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

func main() {
	pattern := flag.String("pattern", "neighbours", "access pattern")
	hintName := flag.String("hint", "sparse", "put hint: none, dense, sparse")
	fence := flag.Bool("fence", false, "fence between puts and gets")
	src := flag.Bool("src", false, "gets name the rank that put the key")
	flag.Parse()
	if err := run(*pattern, *hintName, *fence, *src); err != nil {
		fmt.Fprintf(os.Stderr, "kvsprog: %v\n", err)
		os.Exit(1)
	}
}

func run(pattern, hintName string, fence, src bool) error {
	hint := map[string]client.Hint{"none": client.HintNone, "dense": client.Dense, "sparse": client.Sparse}[hintName]
	c, err := client.Init()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	me, n := c.Rank(), c.Size()
	get := func(key string, from int, want string) error {
		opts := []client.GetOption{}
		if !fence {
			opts = append(opts, client.WaitForPut())
		}
		if src {
			opts = append(opts, client.FromRank(from))
		}
		v, err := c.Get(ctx, key, opts...)
		if err != nil {
			return fmt.Errorf("rank %d: get %s: %w", me, key, err)
		}
		if string(v) != want {
			return fmt.Errorf("rank %d: get %s = %q, want %q", me, key, v, want)
		}
		return nil
	}
	val := func(key string) string { return "value-of-" + key + "-0123456789abcdef" }
	sync := func() error {
		if fence {
			return c.Fence(ctx)
		}
		return nil
	}
	switch pattern {
	case "neighbours":
		key := func(r int) string { return fmt.Sprintf("nb-%d", r) }
		if err := c.Put(key(me), []byte(val(key(me))), hint); err != nil {
			return err
		}
		if err := sync(); err != nil {
			return err
		}
		for _, r := range []int{(me + n - 1) % n, (me + 1) % n} {
			if err := get(key(r), r, val(key(r))); err != nil {
				return err
			}
		}
	case "bcast":
		if me == 0 {
			if err := c.Put("bcast", []byte(val("bcast")), hint); err != nil {
				return err
			}
		}
		if err := sync(); err != nil {
			return err
		}
		if err := get("bcast", 0, val("bcast")); err != nil {
			return err
		}
	case "late", "late-die":
		last := n - 1
		// Every rank has started before the others ask and the last
		// one's 300 ms begin: on a loaded machine starting the ranks may
		// take longer than that.
		if err := c.Fence(ctx); err != nil {
			return err
		}
		if me == last && pattern == "late-die" {
			time.Sleep(300 * time.Millisecond)
			os.Exit(3)
		}
		if me == last {
			time.Sleep(300 * time.Millisecond)
			if err := c.Put("late", []byte(val("late")), hint); err != nil {
				return err
			}
		} else if err := get("late", last, val("late")); err != nil {
			return err
		}
	case "stale":
		fence = true // the pattern is about fences
		for i, v := range []string{"first", "second"} {
			if me == 0 {
				if err := c.Put("stale", []byte(v), hint); err != nil {
					return err
				}
			}
			if err := c.Fence(ctx); err != nil {
				return err
			}
			if err := get("stale", 0, v); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
			if err := c.Fence(ctx); err != nil { // everyone read it before it changes
				return err
			}
		}
	case "deadlock":
		if me%2 == 0 {
			if err := c.Fence(ctx); err != nil { // some ranks in a collective, the others in gets
				return err
			}
		}
		_, err := c.Get(ctx, "never-put", client.WaitForPut())
		return fmt.Errorf("rank %d: get of a key nobody puts returned: %v", me, err)
	case "skipfence":
		if me%2 == 1 {
			return c.Finalize()
		}
		err := c.Fence(ctx)
		return fmt.Errorf("rank %d: a fence the odd ranks never enter returned: %v", me, err)
	case "detached":
		if err := detached(ctx, c, hint); err != nil {
			return err
		}
	case "edges":
		if err := edges(ctx, c); err != nil {
			return err
		}
	case "finalize":
		return finalizeOutstanding(ctx, c)
	case "abort":
		if me == n-1 {
			if err := c.Abort(7, "kvsprog aborts"); err != nil {
				return fmt.Errorf("rank %d: abort: %w", me, err)
			}
			time.Sleep(time.Minute)
			return fmt.Errorf("rank %d: still running a minute after its abort", me)
		}
		<-ctx.Done()
		return fmt.Errorf("rank %d: still running %v after the job began, waiting for the abort to end it", me, 30*time.Second)
	case "local":
		info := c.Info()
		fmt.Printf("kvsprog local: rank %d local %d of %d\n", me, info.LocalRank, info.LocalSize)
	case "names":
		name := fmt.Sprintf("unpublished-%d", me)
		if p, err := c.Lookup(ctx, name); !errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("rank %d: lookup of a name nobody published: %q, %v; want ErrNotFound", me, p, err)
		}
		if err := c.Unpublish(ctx, name); !errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("rank %d: unpublish of a name nobody published: %v; want ErrNotFound", me, err)
		}
	case "unfenced":
		if err := unfenced(ctx, c); err != nil {
			return err
		}
	case "missing":
		start := time.Now()
		for _, key := range []string{"no-such-key", "-NONEXIST-KEY"} {
			opts := []client.GetOption{}
			if src {
				opts = append(opts, client.FromRank((me+1)%n))
			}
			if v, err := c.Get(ctx, key, opts...); err == nil {
				return fmt.Errorf("rank %d: get %s found %q; want not found", me, key, v)
			}
		}
		if d := time.Since(start); d > 5*time.Second {
			return fmt.Errorf("rank %d: two gets of missing keys took %v", me, d)
		}
	default:
		return fmt.Errorf("unknown pattern %q", pattern)
	}
	// One more fence before finalize: every node's counters, booked once
	// its own ranks are done, then cover every get of the job.
	if err := c.Fence(ctx); err != nil {
		return err
	}
	if err := c.Finalize(); err != nil {
		return err
	}
	if me == 0 {
		fmt.Printf("kvsprog ok: %s, %d ranks\n", pattern, n)
	}
	return nil
}

// detached is the pattern of that name (see the top).
func detached(ctx context.Context, c *client.Client, hint client.Hint) error {
	me, n := c.Rank(), c.Size()
	last := n - 1
	mine := []byte(fmt.Sprintf("ag-%d", me))
	var vals client.Values
	if me == last {
		r := c.Iallgather(mine)
		time.Sleep(300 * time.Millisecond)
		if err := c.Put("late", []byte("after-work"), client.Sparse); err != nil {
			return err
		}
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("rank %d: iallgather: %w", me, err)
		}
		vals = r.Values()
	} else {
		if v, err := c.Get(ctx, "late", client.WaitForPut()); err != nil || string(v) != "after-work" {
			return fmt.Errorf("rank %d: get of a key put after an iallgather: %q, %v", me, v, err)
		}
		var err error
		if vals, err = c.Allgather(ctx, mine); err != nil {
			return fmt.Errorf("rank %d: allgather: %w", me, err)
		}
	}
	for r := range n {
		if got, want := string(vals.At(r)), fmt.Sprintf("ag-%d", r); got != want {
			return fmt.Errorf("rank %d: allgather value of rank %d = %q, want %q", me, r, got, want)
		}
	}

	// A wait cut short: the rank works again and may still put.
	if me == last {
		f := c.Ifence()
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := f.Wait(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("rank %d: a fence's wait with a 50 ms context: %v, want its deadline", me, err)
		}
		short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = c.Get(short, "nobody-puts", client.WaitForPut())
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("rank %d: a waiting get with a 50 ms context: %v, want its deadline", me, err)
		}
		time.Sleep(1500 * time.Millisecond)
		if err := c.Put("late2", []byte("after-cut"), hint); err != nil {
			return err
		}
		if err := f.Wait(ctx); err != nil {
			return fmt.Errorf("rank %d: ifence: %w", me, err)
		}
	} else {
		time.Sleep(time.Second)
		if v, err := c.Get(ctx, "late2", client.WaitForPut()); err != nil || string(v) != "after-cut" {
			return fmt.Errorf("rank %d: get of a key put after a cut wait: %q, %v", me, v, err)
		}
		if err := c.Fence(ctx); err != nil {
			return err
		}
	}

	// Waiting for a detached fence is waiting: a real deadlock fails.
	var err error
	if me == last {
		err = c.Ifence().Wait(ctx)
	} else {
		_, err = c.Get(ctx, "never-put", client.WaitForPut())
	}
	if err == nil || !strings.Contains(err.Error(), "deadlock") {
		return fmt.Errorf("rank %d: everyone waiting: %v, want a deadlock", me, err)
	}
	return nil
}

// edges is the pattern of that name (see the top).
func edges(ctx context.Context, c *client.Client) error {
	me, n := c.Rank(), c.Size()
	cases := []struct {
		name     string
		key      func(r int) string
		val      func(r int) []byte
		tooLarge bool // refused with ErrTooLarge, if refused
	}{
		{"value1024", func(r int) string { return fmt.Sprintf("edge-value-%d", r) },
			func(r int) []byte { return []byte(strings.Repeat(string(rune('a'+r%26)), 1024)) }, true},
		{"key64", func(r int) string { return fmt.Sprintf("edge-key-%055d", r) },
			func(r int) []byte { return fmt.Appendf(nil, "key64-of-%d", r) }, false},
		{"semicolon", func(r int) string { return fmt.Sprintf("edge-semicolon-%d", r) },
			func(r int) []byte { return fmt.Appendf(nil, "a;b;;c;%d", r) }, false},
	}
	kept := make([]bool, len(cases))
	for i, tc := range cases {
		if len(tc.key(me)) > 64 {
			return fmt.Errorf("rank %d: %s: key of %d bytes", me, tc.name, len(tc.key(me)))
		}
		err := c.Put(tc.key(me), tc.val(me), client.HintNone)
		if err != nil && tc.tooLarge && !errors.Is(err, client.ErrTooLarge) {
			return fmt.Errorf("rank %d: %s refused: %v, want ErrTooLarge", me, tc.name, err)
		}
		kept[i] = err == nil
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	nb := (me + 1) % n
	var line []string
	for i, tc := range cases {
		outcome := "refused"
		if kept[i] {
			outcome = "kept"
			v, err := c.Get(ctx, tc.key(nb), client.FromRank(nb))
			if err != nil || string(v) != string(tc.val(nb)) {
				return fmt.Errorf("rank %d: %s put by rank %d: read %d bytes %.20q (%v), put %d bytes %.20q",
					me, tc.name, nb, len(v), v, err, len(tc.val(nb)), tc.val(nb))
			}
		}
		line = append(line, tc.name+"="+outcome)
	}
	if me == 0 {
		fmt.Printf("kvsprog edges: %s\n", strings.Join(line, " "))
	}
	return nil
}

// finalizeOutstanding is the pattern "finalize" (see the top).
func finalizeOutstanding(ctx context.Context, c *client.Client) error {
	me, n := c.Rank(), c.Size()
	if me == n-1 {
		time.Sleep(300 * time.Millisecond)
	}
	ag := c.Iallgather(fmt.Appendf(nil, "fin-%d", me))
	f := c.Ifence()
	if err := c.Finalize(); err != nil {
		return fmt.Errorf("rank %d: finalize with an allgather and a fence outstanding: %w", me, err)
	}
	if err := ag.Wait(ctx); err != nil {
		return fmt.Errorf("rank %d: allgather waited for after finalize: %w", me, err)
	}
	if err := f.Wait(ctx); err != nil {
		return fmt.Errorf("rank %d: fence waited for after finalize: %w", me, err)
	}
	vals := ag.Values()
	for r := range n {
		if got, want := string(vals.At(r)), fmt.Sprintf("fin-%d", r); got != want {
			return fmt.Errorf("rank %d: allgather value of rank %d = %q, want %q", me, r, got, want)
		}
	}
	fmt.Printf("kvsprog finalize: rank %d ok\n", me)
	return nil
}

// unfenced is the pattern of that name (see the top).
func unfenced(ctx context.Context, c *client.Client) error {
	me, n := c.Rank(), c.Size()
	key := fmt.Sprintf("unfenced-%d", (me+1)%n)
	outcome := func(err error, found string) (string, error) {
		switch {
		case err == nil:
			return "", fmt.Errorf("rank %d: get %s before any fence found a value", me, key)
		case errors.Is(err, client.ErrNotFound) && found == "not-found",
			errors.Is(err, context.DeadlineExceeded) && found == "cut-short":
			return found, nil
		case strings.Contains(err.Error(), "fence first"):
			return "refused", nil
		case found == "cut-short" && strings.Contains(err.Error(), "deadlock: every live rank waits"):
			return "deadlock", nil
		}
		return "", fmt.Errorf("rank %d: get %s before any fence: %w", me, key, err)
	}
	_, err := c.Get(ctx, key, client.FromRank((me+1)%n))
	get, err := outcome(err, "not-found")
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Get(wctx, key, client.FromRank((me+1)%n), client.WaitForPut())
	wait, err := outcome(err, "cut-short")
	if err != nil {
		return err
	}
	if me == 0 {
		fmt.Printf("kvsprog unfenced: get=%s wait=%s\n", get, wait)
	}
	return nil
}
