package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/launch"
)

// scenarios are what a rank does in a test job. Each checks every value
// it receives and returns an error on the first mismatch.
var scenarios = map[string]func(context.Context, *rankEnv) error{
	"allgather":   scenarioAllgather,
	"nonblocking": scenarioNonBlocking,
	"outstanding": scenarioOutstanding,
	"epochs":      scenarioEpochs,
	"lifetime":    scenarioLifetime,
	"ring":        scenarioRing,
	"kvs":         scenarioKVS,
	"waitget":     scenarioWaitGet,
	"skipfailed":  scenarioSkipFailed,
	"misuse":      scenarioMisuse,
	"names":       scenarioNames,
	"jobattr":     scenarioJobAttr,
	"nodeattr":    scenarioNodeAttr,
	"limits":      scenarioLimits,
	"singleton":   scenarioSingleton,
	"abort":       scenarioAbort,
	"held":        scenarioHeld,
}

// value is rank r's contribution to round tag: distinct per rank and
// round, of varying length, with bytes the text protocol must escape.
func value(tag string, r int) []byte {
	return fmt.Appendf(nil, "%s;r=%d;%s", tag, r, strings.Repeat("v", r%7))
}

// checkValues checks that vals holds value(tag, r) for every rank r of n.
func checkValues(what string, vals client.Values, tag string, n int) error {
	if vals.Len() != n {
		return fmt.Errorf("%s: %d values for %d ranks", what, vals.Len(), n)
	}
	for r := range n {
		if got, want := vals.At(r), value(tag, r); !bytes.Equal(got, want) {
			return fmt.Errorf("%s: value of rank %d is %q, want %q", what, r, got, want)
		}
	}
	if vals.At(-1) != nil || vals.At(n) != nil {
		return fmt.Errorf("%s: At out of range returns a value", what)
	}
	return nil
}

// scenarioAllgather: three allgathers of distinct values, every entry
// checked; the first result is still readable after the second allgather,
// as the Values contract promises.
func scenarioAllgather(ctx context.Context, e *rankEnv) error {
	var prev client.Values
	for round := range 3 {
		tag := "ag" + strconv.Itoa(round)
		vals, err := e.c.Allgather(ctx, value(tag, e.me))
		if err != nil {
			return err
		}
		if err := checkValues(tag, vals, tag, e.n); err != nil {
			return err
		}
		if round > 0 {
			// The previous result stays valid until this rank starts its
			// second allgather after it.
			ptag := "ag" + strconv.Itoa(round-1)
			if err := checkValues(ptag+" after "+tag, prev, ptag, e.n); err != nil {
				return err
			}
		}
		prev = vals
	}
	return nil
}

// scenarioNonBlocking: Iallgather, Ifence, Iallgather started back to back,
// scenarioOutstanding: five allgathers outstanding at once (an Ifence
// among them), waited for oldest first: every result is read whole,
// though the later ones took the earlier ones' result slots.
func scenarioOutstanding(ctx context.Context, e *rankEnv) error {
	var rs []client.Request
	for i := range 5 {
		rs = append(rs, e.c.Iallgather(value(fmt.Sprintf("out%d", i), e.me)))
		if i == 2 {
			rs = append(rs, e.c.Ifence())
		}
	}
	k := 0
	for i, r := range rs {
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if i == 3 {
			continue // the fence
		}
		tag := fmt.Sprintf("out%d", k)
		k++
		if err := checkValues(tag, r.Values(), tag, e.n); err != nil {
			return err
		}
	}
	return nil
}

// scenarioHeld runs many collectives, every kind and way of waiting,
// each result read: what the client holds of them stays bounded (it
// held a request and its response for every collective ever started
// over the text protocol), and a request waited for again long after
// it completed is still done.
func scenarioHeld(ctx context.Context, e *rankEnv) error {
	const rounds = 200
	first := e.c.Ifence()
	for i := range rounds {
		tag := fmt.Sprintf("held%d", i)
		if err := e.c.Fence(ctx); err != nil {
			return err
		}
		vals, err := e.c.Allgather(ctx, value(tag, e.me))
		if err != nil {
			return err
		}
		if err := checkValues(tag, vals, tag, e.n); err != nil {
			return err
		}
		r := e.c.Iallgather(value(tag+"i", e.me))
		if err := r.Wait(ctx); err != nil {
			return err
		}
		if err := checkValues(tag+"i", r.Values(), tag+"i", e.n); err != nil {
			return err
		}
		if err := e.c.Ifence().Wait(ctx); err != nil {
			return err
		}
	}
	if err := first.Wait(ctx); err != nil || !first.Test() {
		return fmt.Errorf("the first fence, waited for after %d more collectives: %v, done %v", 4*rounds, err, first.Test())
	}
	if n := client.Held(e.c); n > 4 {
		return fmt.Errorf("%d collectives held after %d, all read", n, 4*rounds+1)
	}
	return nil
}

// the last polled with Test until done, then waited in reverse order.
func scenarioNonBlocking(ctx context.Context, e *rankEnv) error {
	for round := range 10 {
		ta, tb := fmt.Sprintf("nb%da", round), fmt.Sprintf("nb%db", round)
		ra := e.c.Iallgather(value(ta, e.me))
		rf := e.c.Ifence()
		rb := e.c.Iallgather(value(tb, e.me))
		polls := 0
		for !rb.Test() {
			polls++
			if ctx.Err() != nil {
				return fmt.Errorf("round %d: Test never reported the last allgather done (%d polls)", round, polls)
			}
			time.Sleep(50 * time.Microsecond)
		}
		if !rb.Test() {
			return fmt.Errorf("round %d: Test reported done, then not done", round)
		}
		if err := rb.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: wait for the second allgather: %w", round, err)
		}
		if err := checkValues(tb, rb.Values(), tb, e.n); err != nil {
			return err
		}
		if err := rf.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: wait for the fence: %w", round, err)
		}
		if !rf.Test() || !ra.Test() {
			return fmt.Errorf("round %d: Test false for requests completed before the last one", round)
		}
		if err := ra.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: wait for the first allgather: %w", round, err)
		}
		// Whether the first result is still readable after a fence and an
		// allgather is TestValuesLifetime's business; here it must be the
		// right value or nothing, never another round's bytes.
		va := ra.Values()
		if va.Len() != e.n {
			return fmt.Errorf("round %d: first allgather has %d values", round, va.Len())
		}
		for r := range e.n {
			if got := va.At(r); got != nil && !bytes.Equal(got, value(ta, r)) {
				return fmt.Errorf("round %d: first allgather's value of rank %d is %q", round, r, got)
			}
		}
		// Both allgathers again, this time with the fence last: the
		// first result must survive (one allgather after it).
		ra = e.c.Iallgather(value(ta, e.me))
		rb = e.c.Iallgather(value(tb, e.me))
		rf = e.c.Ifence()
		for _, r := range []client.Request{rf, rb, ra} {
			if err := r.Wait(ctx); err != nil {
				return fmt.Errorf("round %d (fence last): %w", round, err)
			}
		}
		if err := checkValues(ta+" (fence last)", ra.Values(), ta, e.n); err != nil {
			return err
		}
		if err := checkValues(tb+" (fence last)", rb.Values(), tb, e.n); err != nil {
			return err
		}
	}
	var zero client.Request
	if err := zero.Wait(ctx); !errors.Is(err, client.ErrNoRequest) {
		return fmt.Errorf("zero Request Wait: %v, want ErrNoRequest", err)
	}
	return nil
}

// scenarioEpochs: 50 alternating fences and allgathers; each allgather
// carries its round number, so a result from another epoch shows.
func scenarioEpochs(ctx context.Context, e *rankEnv) error {
	for k := range 50 {
		if k%2 == 0 {
			if err := e.c.Fence(ctx); err != nil {
				return fmt.Errorf("fence %d: %w", k, err)
			}
			continue
		}
		tag := "ep" + strconv.Itoa(k)
		vals, err := e.c.Allgather(ctx, value(tag, e.me))
		if err != nil {
			return fmt.Errorf("allgather %d: %w", k, err)
		}
		if err := checkValues(tag, vals, tag, e.n); err != nil {
			return err
		}
	}
	return nil
}

// scenarioLifetime: an Allgather, a Fence, an Allgather; the first result
// must still be readable (client's doc: valid until this rank starts its
// second allgather after the one that produced it).
func scenarioLifetime(ctx context.Context, e *rankEnv) error {
	first, err := e.c.Allgather(ctx, value("lt1", e.me))
	if err != nil {
		return err
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if err := checkValues("first allgather after one fence", first, "lt1", e.n); err != nil {
		return err
	}
	second, err := e.c.Allgather(ctx, value("lt2", e.me))
	if err != nil {
		return err
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	return checkValues("second allgather after one fence", second, "lt2", e.n)
}

// scenarioRing: positions follow rank order on one node; the neighbours'
// values match their positions.
func scenarioRing(ctx context.Context, e *rankEnv) error {
	for round := range 2 {
		tag := "ring" + strconv.Itoa(round)
		rr, err := e.c.Ring(ctx, value(tag, e.me))
		if err != nil {
			return err
		}
		if rr.Size != e.n || rr.Rank != e.me {
			return fmt.Errorf("ring position %d of %d, want %d of %d", rr.Rank, rr.Size, e.me, e.n)
		}
		l, r := (e.me+e.n-1)%e.n, (e.me+1)%e.n
		if !bytes.Equal(rr.Left, value(tag, l)) || !bytes.Equal(rr.Right, value(tag, r)) {
			return fmt.Errorf("%s: left %q right %q, want %q %q", tag, rr.Left, rr.Right, value(tag, l), value(tag, r))
		}
	}
	return nil
}

// scenarioKVS: puts with every hint, a fence, gets of every rank's keys
// with and without FromRank; a Sparse put seen without a fence; a missing
// key fails promptly with ErrNotFound.
func scenarioKVS(ctx context.Context, e *rankEnv) error {
	hints := []struct {
		name string
		h    client.Hint
	}{{"none", client.HintNone}, {"dense", client.Dense}, {"sparse", client.Sparse}}
	key := func(h string, r int) string { return fmt.Sprintf("k-%s-%d", h, r) }
	for _, h := range hints {
		if err := e.c.Put(key(h.name, e.me), value(h.name, e.me), h.h); err != nil {
			return err
		}
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	for r := range e.n {
		for _, h := range hints {
			for _, from := range []bool{false, true} {
				var opts []client.GetOption
				if from {
					opts = append(opts, client.FromRank(r))
				}
				v, err := e.c.Get(ctx, key(h.name, r), opts...)
				if err != nil {
					return fmt.Errorf("get %s (FromRank %v): %w", key(h.name, r), from, err)
				}
				if !bytes.Equal(v, value(h.name, r)) {
					return fmt.Errorf("get %s (FromRank %v) = %q, want %q", key(h.name, r), from, v, value(h.name, r))
				}
			}
		}
	}
	// A Sparse put is visible at once: the others poll without a fence.
	owner := e.n - 1
	if e.me == owner {
		if err := e.c.Put("early", value("early", owner), client.Sparse); err != nil {
			return err
		}
	} else {
		for {
			v, err := e.c.Get(ctx, "early", client.FromRank(owner))
			if err == nil {
				if !bytes.Equal(v, value("early", owner)) {
					return fmt.Errorf("get early = %q", v)
				}
				break
			}
			if !errors.Is(err, client.ErrNotFound) {
				return fmt.Errorf("get early: %w", err)
			}
			if ctx.Err() != nil {
				return errors.New("a Sparse put never became visible without a fence")
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A key nobody put: ErrNotFound, promptly.
	t0 := time.Now()
	_, err := e.c.Get(ctx, "missing-"+strconv.Itoa(e.me))
	if !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("get of a missing key: %v, want ErrNotFound", err)
	}
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Rank != e.me {
		return fmt.Errorf("get of a missing key: %v is not a *client.Error of rank %d", err, e.me)
	}
	if d := time.Since(t0); d > time.Second {
		return fmt.Errorf("get of a missing key took %v", d)
	}
	// Keep every rank until the others are done reading.
	return e.c.Fence(ctx)
}

// scenarioWaitGet: Get(WaitForPut) of a key another rank puts late
// returns it; then, with every other rank finalized, rank 0's waiting get
// of a key nobody will put fails instead of hanging.
func scenarioWaitGet(ctx context.Context, e *rankEnv) error {
	late := e.n - 1
	if e.me == late {
		time.Sleep(200 * time.Millisecond)
		if err := e.c.Put("late", value("late", late), client.Sparse); err != nil {
			return err
		}
	} else {
		v, err := e.c.Get(ctx, "late", client.WaitForPut())
		if err != nil {
			return fmt.Errorf("waiting get of a late put: %w", err)
		}
		if !bytes.Equal(v, value("late", late)) {
			return fmt.Errorf("waiting get of a late put = %q", v)
		}
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if e.me != 0 {
		return nil // finalize and exit
	}
	const bound = 5 * time.Second
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	t0 := time.Now()
	v, err := e.c.Get(wctx, "never", client.WaitForPut())
	if err == nil {
		return fmt.Errorf("waiting get of a key nobody puts returned %q", v)
	}
	if d := time.Since(t0); d > bound+time.Second {
		return fmt.Errorf("waiting get of a key nobody puts took %v (%v)", d, err)
	}
	return nil
}

// scenarioNames: every rank publishes a name, all look all of them up,
// each unpublishes its own, and then lookups fail with ErrNotFound.
func scenarioNames(ctx context.Context, e *rankEnv) error {
	name := func(r int) string { return "svc-" + strconv.Itoa(r) }
	port := func(r int) string { return "tag#" + strconv.Itoa(r) + "$port=" + strconv.Itoa(4000+r) + "$" }
	if err := e.c.Publish(ctx, name(e.me), port(e.me)); err != nil {
		return err
	}
	if err := e.c.Publish(ctx, name(e.me), "again"); err == nil {
		return errors.New("publishing a name twice succeeded")
	}
	// An empty name or port is refused on every path (over shared
	// memory it was published).
	if err := e.c.Publish(ctx, "", "p"); err == nil {
		return errors.New("publishing an empty name succeeded")
	}
	if err := e.c.Publish(ctx, "empty-port-"+strconv.Itoa(e.me), ""); err == nil {
		return errors.New("publishing an empty port succeeded")
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	for r := range e.n {
		p, err := e.c.Lookup(ctx, name(r))
		if err != nil {
			return err
		}
		if p != port(r) {
			return fmt.Errorf("lookup %s = %q, want %q", name(r), p, port(r))
		}
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if err := e.c.Unpublish(ctx, name(e.me)); err != nil {
		return err
	}
	if err := e.c.Unpublish(ctx, name(e.me)); !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("unpublishing %s twice: %v, want ErrNotFound", name(e.me), err)
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	for r := range e.n {
		if p, err := e.c.Lookup(ctx, name(r)); !errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("lookup of unpublished %s = %q, %v; want ErrNotFound", name(r), p, err)
		}
	}
	return nil
}

// jobUniverse is the universe size the jobattr test gives launch.Config.
const jobUniverse = 42

func scenarioJobAttr(ctx context.Context, e *rankEnv) error {
	want := map[string]string{
		"PMI_process_mapping": launch.BlockMapping(e.n, 1, e.n),
		"universeSize":        strconv.Itoa(jobUniverse),
	}
	if e.mode == "singleton" {
		want["universeSize"] = "1"
	}
	for k, w := range want {
		v, ok, err := e.c.JobAttr(ctx, k)
		if err != nil || !ok || v != w {
			return fmt.Errorf("job attribute %s = %q, %v, %v; want %q", k, v, ok, err, w)
		}
	}
	if v, ok, err := e.c.JobAttr(ctx, "no-such-attribute"); err != nil || ok {
		return fmt.Errorf("unknown job attribute = %q, %v, %v; want not found", v, ok, err)
	}
	return nil
}

// scenarioNodeAttr: the last rank puts a node attribute late; the others
// wait for it; a read without wait of a missing attribute is not found; a
// second put replaces the value; an attribute value at the limit passes,
// one byte more is refused; a wait nobody can end fails (only rank 0
// waits, after every other rank has finalized).
func scenarioNodeAttr(ctx context.Context, e *rankEnv) error {
	last := e.n - 1
	if e.me == last {
		time.Sleep(100 * time.Millisecond)
		if err := e.c.PutNodeAttr(ctx, "shared", "first"); err != nil {
			return err
		}
		if err := e.c.PutNodeAttr(ctx, "shared", "v;=x"); err != nil {
			return err
		}
	} else {
		v, ok, err := e.c.NodeAttr(ctx, "shared", true)
		if err != nil || !ok || (v != "first" && v != "v;=x") {
			return fmt.Errorf("waiting read of node attribute = %q, %v, %v", v, ok, err)
		}
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if v, ok, err := e.c.NodeAttr(ctx, "shared", false); err != nil || !ok || v != "v;=x" {
		return fmt.Errorf("node attribute after a second put = %q, %v, %v; want the second value", v, ok, err)
	}
	if v, ok, err := e.c.NodeAttr(ctx, "missing", false); err != nil || ok {
		return fmt.Errorf("missing node attribute = %q, %v, %v; want not found", v, ok, err)
	}
	if err := e.c.PutNodeAttr(ctx, "max", strings.Repeat("m", 1024)); err != nil {
		return fmt.Errorf("node attribute of 1024 bytes: %w", err)
	}
	if err := e.c.PutNodeAttr(ctx, "big", strings.Repeat("m", 1025)); !errors.Is(err, client.ErrTooLarge) {
		return fmt.Errorf("node attribute of 1025 bytes: %v, want ErrTooLarge", err)
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if e.me != 0 {
		return nil // finalize and exit
	}
	// The wait ends once the other ranks have finalized: then nobody can
	// put it.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, ok, err := e.c.NodeAttr(wctx, "never", true)
	switch {
	case err == nil:
		return fmt.Errorf("waiting read of a node attribute nobody puts = %q, %v", v, ok)
	case wctx.Err() != nil:
		return fmt.Errorf("waiting read of a node attribute nobody puts ran into the context: %v", err)
	case !strings.Contains(err.Error(), "deadlock"):
		return fmt.Errorf("waiting read of a node attribute nobody puts: %v, want a deadlock error", err)
	}
	return nil
}

// scenarioSkipFailed: rank 0 waits for a key nobody puts while the
// others fence; the deadlock check fails both (rank 0 never entered the
// fence, and the agent moves it past that epoch). Then every rank fences
// again, and that fence completes for all, rank 0's included: its next
// collective has the number the agent expects.
func scenarioSkipFailed(ctx context.Context, e *rankEnv) error {
	var err error
	if e.me == 0 {
		_, err = e.c.Get(ctx, "never", client.WaitForPut())
	} else {
		err = e.c.Fence(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "deadlock") {
		return fmt.Errorf("rank %d's call in a deadlock: %v, want a deadlock error", e.me, err)
	}
	if err := e.c.Put("after", value("after", e.me), client.HintNone); err != nil {
		return err
	}
	if err := e.c.Fence(ctx); err != nil {
		return fmt.Errorf("the fence after the failed one: %w", err)
	}
	for r := range e.n {
		if v, err := e.c.Get(ctx, "after"); err != nil || !bytes.HasPrefix(v, []byte("after;")) {
			return fmt.Errorf("get after the fence (rank %d): %q, %v", r, v, err)
		}
	}
	return nil
}

// scenarioMisuse: calls a program gets wrong fail with an error and the
// job goes on: a NUL byte in a put's key or value (on shared memory the
// put was sent and the agent ended the job); a FromRank of no rank of
// the job, negative or too large (an unknown rank, where shared memory
// sent it and the job ended); a call
// whose context is already cancelled is not made (it took effect and
// reported the cancellation), a Fence or an Allgather neither (the rank
// entered the collective); a second Init in a launched rank (it closed
// descriptors the program had opened since).
func scenarioMisuse(ctx context.Context, e *rankEnv) error {
	if err := e.c.Put("k\x00", []byte("v"), client.HintNone); err == nil {
		return errors.New("a put whose key holds a NUL byte succeeded")
	}
	if err := e.c.Put("k", []byte("a\x00b"), client.HintNone); err == nil {
		return errors.New("a put whose value holds a NUL byte succeeded")
	}
	for _, r := range []int{-5, e.n, e.n + 100} {
		if _, err := e.c.Get(ctx, "nope", client.FromRank(r)); !errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("get from rank %d of %d: %v, want ErrNotFound", r, e.n, err)
		}
	}
	name := fmt.Sprintf("misuse-%d", e.me)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.c.Publish(cancelled, name, "p"); !errors.Is(err, context.Canceled) {
		return fmt.Errorf("publish with a cancelled context: %v, want context.Canceled", err)
	}
	if err := e.c.Publish(ctx, name, "p"); err != nil {
		return fmt.Errorf("publish after the cancelled one (which must not have taken effect): %w", err)
	}
	if err := e.c.Unpublish(ctx, name); err != nil {
		return err
	}
	if e.me%2 == 0 {
		// Only the even ranks: had they entered the fence and the
		// allgather, the collectives below would not line up.
		if err := e.c.Fence(cancelled); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("fence with a cancelled context: %v, want context.Canceled", err)
		}
		if _, err := e.c.Allgather(cancelled, []byte("never")); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("allgather with a cancelled context: %v, want context.Canceled", err)
		}
	}
	vals, err := e.c.Allgather(ctx, value("misuse", e.me))
	if err != nil {
		return fmt.Errorf("allgather after the cancelled calls (which must not have taken effect): %w", err)
	}
	if err := checkValues("allgather after the cancelled calls", vals, "misuse", e.n); err != nil {
		return err
	}
	if e.mode != "singleton" {
		f, err := os.Open(os.DevNull) // may take a number the launcher's descriptors had
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := client.Init(); !errors.Is(err, client.ErrInitialized) {
			return fmt.Errorf("second Init: %v, want ErrInitialized", err)
		}
		if _, err := f.Stat(); err != nil {
			return fmt.Errorf("the second Init touched a descriptor of the program's: %w", err)
		}
	}
	// A fence has no values, on every transport (over shared memory
	// Values read the fence's epoch as an allgather's: one empty value
	// per rank).
	f := e.c.Ifence()
	if err := f.Wait(ctx); err != nil {
		return err
	}
	if n := f.Values().Len(); n != 0 {
		return fmt.Errorf("a fence's Values has %d values, want none", n)
	}
	return e.c.Fence(ctx) // the job goes on
}

// scenarioLimits: too-large values and keys are refused; a value at the
// PMI-2 limit passes; after Finalize everything fails with ErrFinalized.
func scenarioLimits(ctx context.Context, e *rankEnv) error {
	big := bytes.Repeat([]byte("x"), 1025)
	max := bytes.Repeat([]byte{'a' + byte(e.me%26)}, 1024)
	tooLarge := func(what string, err error) error {
		if !errors.Is(err, client.ErrTooLarge) {
			return fmt.Errorf("%s of %d bytes: %v, want ErrTooLarge", what, len(big), err)
		}
		return nil
	}
	if err := tooLarge("put", e.c.Put("big", big, client.HintNone)); err != nil {
		return err
	}
	_, err := e.c.Allgather(ctx, big)
	if err := tooLarge("allgather", err); err != nil {
		return err
	}
	if err := tooLarge("iallgather", e.c.Iallgather(big).Wait(ctx)); err != nil {
		return err
	}
	_, err = e.c.Ring(ctx, big)
	if err := tooLarge("ring", err); err != nil {
		return err
	}
	if want := "ring: 1025 bytes (limit 1024)"; !strings.Contains(err.Error(), want) {
		return fmt.Errorf("ring of %d bytes: %q does not say %q", len(big), err, want)
	}
	if err := e.c.Put(strings.Repeat("k", 65), []byte("v"), client.HintNone); err == nil {
		return errors.New("put of a 65-byte key succeeded")
	}
	// Refused requests left nothing behind: the collectives still line up.
	vals, err := e.c.Allgather(ctx, max)
	if err != nil {
		return fmt.Errorf("allgather of %d bytes: %w", len(max), err)
	}
	for r := range e.n {
		if w := bytes.Repeat([]byte{'a' + byte(r%26)}, 1024); !bytes.Equal(vals.At(r), w) {
			return fmt.Errorf("allgather of 1024 bytes: value of rank %d has %d bytes", r, len(vals.At(r)))
		}
	}
	if err := e.c.Put("max-"+strconv.Itoa(e.me), max, client.HintNone); err != nil {
		return err
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if v, err := e.c.Get(ctx, "max-"+strconv.Itoa(e.me)); err != nil || !bytes.Equal(v, max) {
		return fmt.Errorf("get of a 1024-byte value: %d bytes, %v", len(v), err)
	}

	if err := e.c.Finalize(); err != nil {
		return err
	}
	if err := e.c.Finalize(); err != nil {
		return fmt.Errorf("second Finalize: %w", err)
	}
	fin := func(what string, err error) error {
		if !errors.Is(err, client.ErrFinalized) {
			return fmt.Errorf("%s after Finalize: %v, want ErrFinalized", what, err)
		}
		return nil
	}
	_, errAg := e.c.Allgather(ctx, []byte("x"))
	_, errGet := e.c.Get(ctx, "max-0")
	_, errRing := e.c.Ring(ctx, []byte("x"))
	_, _, errAttr := e.c.JobAttr(ctx, "universeSize")
	_, errLookup := e.c.Lookup(ctx, "svc")
	for _, c := range []struct {
		what string
		err  error
	}{
		{"put", e.c.Put("k", []byte("v"), client.Sparse)},
		{"fence", e.c.Fence(ctx)},
		{"ifence", e.c.Ifence().Wait(ctx)},
		{"iallgather", e.c.Iallgather([]byte("x")).Wait(ctx)},
		{"allgather", errAg},
		{"get", errGet},
		{"ring", errRing},
		{"job attribute", errAttr},
		{"publish", e.c.Publish(ctx, "svc", "p")},
		{"lookup", errLookup},
		{"unpublish", e.c.Unpublish(ctx, "svc")},
		{"abort", e.c.Abort(3, "after finalize")},
	} {
		if err := fin(c.what, c.err); err != nil {
			return err
		}
	}
	return nil
}

// scenarioSingleton runs without any launcher: rank 0 of 1.
func scenarioSingleton(ctx context.Context, e *rankEnv) error {
	info := e.c.Info()
	if info.Rank != 0 || info.Size != 1 || info.LocalRank != 0 || info.LocalSize != 1 {
		return fmt.Errorf("singleton info %+v", info)
	}
	vals, err := e.c.Allgather(ctx, value("single", 0))
	if err != nil {
		return err
	}
	if err := checkValues("singleton allgather", vals, "single", 1); err != nil {
		return err
	}
	rr, err := e.c.Ring(ctx, []byte("me"))
	if err != nil {
		return err
	}
	if rr.Rank != 0 || rr.Size != 1 || string(rr.Left) != "me" || string(rr.Right) != "me" {
		return fmt.Errorf("singleton ring %+v", rr)
	}
	if err := e.c.Put("k", []byte("v"), client.Dense); err != nil {
		return err
	}
	if err := e.c.Fence(ctx); err != nil {
		return err
	}
	if v, err := e.c.Get(ctx, "k", client.FromRank(0)); err != nil || string(v) != "v" {
		return fmt.Errorf("singleton get = %q, %v", v, err)
	}
	if _, err := e.c.Get(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("singleton get of a missing key: %v", err)
	}
	if err := e.c.PutNodeAttr(ctx, "na", "nv"); err != nil {
		return err
	}
	if v, ok, err := e.c.NodeAttr(ctx, "na", true); err != nil || !ok || v != "nv" {
		return fmt.Errorf("singleton node attribute = %q, %v, %v", v, ok, err)
	}
	if _, _, err := e.c.NodeAttr(ctx, "none", true); err == nil {
		return errors.New("singleton: a waiting read of a node attribute nobody puts returned")
	}
	req := e.c.Iallgather([]byte("i"))
	if !req.Test() {
		return errors.New("singleton Iallgather not done at once")
	}
	if err := req.Wait(ctx); err != nil || string(req.Values().At(0)) != "i" {
		return fmt.Errorf("singleton iallgather = %q, %v", req.Values().At(0), err)
	}
	if err := scenarioJobAttr(ctx, e); err != nil {
		return err
	}
	if err := e.c.Abort(3, "no launcher"); !errors.Is(err, client.ErrNotSupported) {
		return fmt.Errorf("singleton abort: %v, want ErrNotSupported", err)
	}
	return nil
}

// abortCode is what the aborting rank asks for.
const abortCode = 5

// scenarioAbort: rank 1 aborts while the others wait in a fence; the job
// must end with the abort's code. Its message is long: an abort must not
// fail for that (over shared memory it was not sent, and the job went on;
// over PMI-2 the agent took it for a broken protocol, exit code 1).
func scenarioAbort(ctx context.Context, e *rankEnv) error {
	if e.me == 1 {
		if err := e.c.Abort(abortCode, strings.Repeat("x", 100<<10)); err != nil {
			return err
		}
		// The launcher ends the job; outlive it so the exit code can only
		// come from the abort.
		time.Sleep(rankTimeout)
		return errors.New("still running after abort")
	}
	if err := e.c.Fence(ctx); err == nil {
		return errors.New("fence completed without the aborting rank")
	}
	time.Sleep(rankTimeout)
	return nil
}
