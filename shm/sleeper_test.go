package shm

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

func newSleeper(t *testing.T) *Sleeper {
	t.Helper()
	s := NewSleeper()
	if s == nil {
		t.Skip("this kernel has no futex_waitv")
	}
	t.Cleanup(s.Close)
	return s
}

// newRingOnlySleeper is a Sleeper whose beds never look at their agents
// unrung: an agent it hands back was woken through its doorbell futex.
func newRingOnlySleeper(t *testing.T) *Sleeper {
	s := newSleeper(t)
	s.check = time.Hour
	return s
}

// parkedAgent is one segment whose agent parks on a Sleeper on its own
// goroutine, each Park's result reported on woke.
type parkedAgent struct {
	seg  *Segment
	woke chan error
}

func parkAgents(t *testing.T, s *Sleeper, n int) []parkedAgent {
	t.Helper()
	as := make([]parkedAgent, n)
	var parks sync.WaitGroup
	for i := range as {
		seg, err := Create(Params{LocalRanks: 1, WorldSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seg.Close() })
		as[i] = parkedAgent{seg: seg, woke: make(chan error, 1)}
		ag := seg.Agent()
		parks.Go(func() { as[i].woke <- ag.Park(s) })
	}
	// Cleanups run last first: no segment is unmapped before its Park
	// has returned (an agent's Close kicks it and waits, the same way).
	t.Cleanup(func() {
		s.Close()
		parks.Wait()
	})
	// Parked: each agent has announced its sleep and sits in a bed.
	deadline := time.Now().Add(10 * time.Second)
	for parkedIn(s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d agents parked after 10 s", parkedIn(s), n)
		}
		time.Sleep(time.Millisecond)
	}
	return as
}

// parkedIn counts the agents in s's beds.
func parkedIn(s *Sleeper) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.beds {
		n += len(b.in)
	}
	return n
}

func wantWoken(t *testing.T, a parkedAgent, within time.Duration, what string) {
	t.Helper()
	select {
	case err := <-a.woke:
		if err != nil {
			t.Fatalf("%s: Park returned %v", what, err)
		}
	case <-time.After(within):
		t.Fatalf("%s: the parked agent was not woken within %v", what, within)
	}
}

func wantAsleep(t *testing.T, a parkedAgent, what string) {
	t.Helper()
	select {
	case err := <-a.woke:
		t.Fatalf("%s: a parked agent with nothing to do woke (%v)", what, err)
	case <-time.After(3 * parkCheck):
	}
}

// Hundreds of parked agents hold a few threads (one per bed of bedSize),
// not one each; a request from a rank wakes exactly its agent, through its
// doorbell (the beds' periodic look is off here); beds whose agents have
// all gone end their goroutines.
func TestSleeperParksManyAgentsOnFewThreads(t *testing.T) {
	s := newRingOnlySleeper(t)
	const n = 3*bedSize + 10 // four beds
	before, err := sys.Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	goroutines := runtime.NumGoroutine()
	as := parkAgents(t, s, n)
	s.mu.Lock()
	beds := len(s.beds)
	s.mu.Unlock()
	if beds != 4 {
		t.Errorf("%d agents in %d beds, want 4", n, beds)
	}
	after, err := sys.Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	// Each sleeping Wait would be a thread: n of them. The beds are 4;
	// the rest is the runtime's own slack.
	if after-before > 4+2*runtime.GOMAXPROCS(0)+8 {
		t.Errorf("%d parked agents took %d more threads (%d before), want about one per bed (%d)", n, after-before, before, beds)
	}
	// A request wakes its agent, and only it.
	if err := as[200].seg.Rank(0).Requests().Push(Header{Op: OpHello}, nil); err != nil {
		t.Fatal(err)
	}
	wantWoken(t, as[200], 5*time.Second, "a request to agent 200")
	if got := as[200].seg.Agent().TakeReady(nil); len(got) != 1 {
		t.Errorf("woken agent finds ready ranks %v, want [0]", got)
	}
	wantAsleep(t, as[0], "after a request to another agent")
	if got := parkedIn(s); got != n-1 {
		t.Errorf("%d agents parked after one woke, want %d", got, n-1)
	}
	// Kick wakes a parked agent (an agent's Close kicks it).
	as[5].seg.Agent().Kick()
	wantWoken(t, as[5], 5*time.Second, "Kick")
	// Wake every other one: the beds empty and their goroutines end.
	for i, a := range as {
		if i != 200 && i != 5 {
			a.seg.Agent().Kick()
			wantWoken(t, a, 5*time.Second, "Kick of every agent")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		beds = len(s.beds)
		s.mu.Unlock()
		if beds == 0 && runtime.NumGoroutine() <= goroutines {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d beds and %d goroutines (%d before) 5 s after every agent woke, want none left", beds, runtime.NumGoroutine(), goroutines)
		}
		time.Sleep(time.Millisecond)
	}
}

// A request whose rank did not ring (every rank can overwrite the
// agent-sleepers word that says the agent sleeps) wakes its parked agent
// within the bed's periodic check, as Wait's timeout bounds it.
func TestSleeperFindsUnrungRequest(t *testing.T) {
	s := newSleeper(t)
	as := parkAgents(t, s, 2)
	seg := as[1].seg
	seg.u32(offAgentSleepers).Store(0) // a stray store: the push below rings nobody
	word := seg.u32(offDoorbell).Load()
	start := time.Now()
	if err := seg.Rank(0).Requests().Push(Header{Op: OpHello}, nil); err != nil {
		t.Fatal(err)
	}
	if seg.u32(offDoorbell).Load() != word {
		t.Fatal("the push rang the doorbell: the test does not test the periodic check")
	}
	wantWoken(t, as[1], 10*parkCheck, "an unrung request")
	if d := time.Since(start); d > 5*parkCheck {
		t.Errorf("an unrung request woke its agent after %v, want within about %v", d, parkCheck)
	}
	wantAsleep(t, as[0], "after another agent's unrung request")
}

// Close hands back every parked agent with ErrSleeperClosed and waits for
// the beds; a later Park fails at once, and the agent can Wait instead.
func TestSleeperClose(t *testing.T) {
	s := newSleeper(t)
	as := parkAgents(t, s, 3)
	s.Close()
	for _, a := range as {
		select {
		case err := <-a.woke:
			if !errors.Is(err, ErrSleeperClosed) {
				t.Errorf("Park across Close: %v, want ErrSleeperClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("an agent still parked 5 s after Close returned")
		}
	}
	s.mu.Lock()
	beds := len(s.beds)
	s.mu.Unlock()
	if beds != 0 {
		t.Errorf("%d beds after Close, want none", beds)
	}
	ag := as[0].seg.Agent()
	if err := ag.Park(s); !errors.Is(err, ErrSleeperClosed) {
		t.Errorf("Park after Close: %v, want ErrSleeperClosed", err)
	}
	if err := ag.Wait(time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait after a refused Park: %v, want ErrTimeout", err)
	}
	if got := as[0].seg.u32(offAgentSleepers).Load(); got != 0 {
		t.Errorf("agent-sleepers word %d after the parks ended, want 0", got)
	}
	s.Close() // idempotent
	var none *Sleeper
	none.Close()
}

// An agent whose ranks are goroutines of this process (InProcessWaiter)
// is not woken through the futex: Park refuses it, and it waits on its
// own.
func TestSleeperRefusesInProcessSegment(t *testing.T) {
	s := newSleeper(t)
	seg, err := NewHeap(Params{LocalRanks: 1, WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(InProcessWaiter())
	start := time.Now()
	if err := seg.Agent().Park(s); err == nil {
		t.Fatal("Park of an in-process segment's agent succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refused Park took %v", d)
	}
	if got := parkedIn(s); got != 0 {
		t.Errorf("%d agents parked, want none", got)
	}
}
