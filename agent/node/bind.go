package node

import (
	"cmp"
	"io"
	"os"
	"slices"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// bindSets gives each of a node's n local ranks the CPUs of one unit
// (Spec.Bind): a hardware thread, a core (its threads) or a socket (its
// cores), out of the CPUs the agent may use. Units are taken in order
// (mapBy core or hwthread) or round robin over sockets (mapBy socket);
// more ranks than units wrap around. It is pure: places come from
// sys.CPUPlaces.
func bindSets(places []sys.CPUPlace, unit, mapBy string, n int) [][]int {
	if len(places) == 0 || n == 0 {
		return nil
	}
	type key struct{ socket, core, cpu int }
	keyOf := func(p sys.CPUPlace) key {
		switch unit {
		case "socket":
			return key{p.Socket, -1, -1}
		case "core":
			if p.Core < 0 { // unknown topology: each CPU its own core
				return key{p.Socket, p.CPU, -1}
			}
			return key{p.Socket, p.Core, -1}
		}
		return key{p.Socket, p.Core, p.CPU}
	}
	var units [][]int
	var keys []key
	for _, p := range places {
		k := keyOf(p)
		i := slices.Index(keys, k)
		if i < 0 {
			keys = append(keys, k)
			units = append(units, nil)
			i = len(units) - 1
		}
		units[i] = append(units[i], p.CPU)
	}
	order := make([]int, len(units))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ka, kb := keys[a], keys[b]
		return cmp.Or(cmp.Compare(ka.socket, kb.socket), cmp.Compare(ka.core, kb.core), cmp.Compare(ka.cpu, kb.cpu))
	})
	if mapBy == "socket" && unit != "socket" {
		// Round robin over sockets: the i-th unit of each socket in turn.
		bySocket := map[int][]int{}
		var sockets []int
		for _, u := range order {
			s := keys[u].socket
			if _, ok := bySocket[s]; !ok {
				sockets = append(sockets, s)
			}
			bySocket[s] = append(bySocket[s], u)
		}
		order = order[:0]
		for i := 0; len(order) < len(units); i++ {
			for _, s := range sockets {
				if i < len(bySocket[s]) {
					order = append(order, bySocket[s][i])
				}
			}
		}
	}
	sets := make([][]int, n)
	for i := range sets {
		sets[i] = units[order[i%len(order)]]
	}
	return sets
}

// stdinFiles returns what n ranks read as their stdin: in itself when it
// is a file and one rank reads it, else the read ends of n pipes that a
// goroutine fills from in (every rank gets every byte). Like pumpStdin in
// package launch, that goroutine is not waited for: it may be blocked
// reading the launcher's input (a terminal) when the job ends, and ends at
// its next read. A rank that exits is dropped; one that lives but does
// not read holds the others once its pipe (64 KiB) is full.
//
// A pipe, not exec.Cmd's copier, so that waiting for a rank never waits
// for a read of the terminal that cannot end.
func stdinFiles(in io.Reader, n int) ([]*os.File, error) {
	if f, ok := in.(*os.File); ok && n == 1 {
		return []*os.File{f}, nil
	}
	rs := make([]*os.File, n)
	ws := make([]*os.File, n)
	for i := range rs {
		var err error
		if rs[i], ws[i], err = os.Pipe(); err != nil {
			for _, f := range append(rs[:i], ws[:i]...) {
				f.Close()
			}
			return nil, err
		}
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			k, err := in.Read(buf)
			live := 0
			for i, w := range ws {
				if w == nil {
					continue
				}
				if _, werr := w.Write(buf[:k]); werr != nil {
					w.Close()
					ws[i] = nil
					continue
				}
				live++
			}
			if err != nil || live == 0 {
				for _, w := range ws {
					if w != nil {
						w.Close()
					}
				}
				return
			}
		}
	}()
	return rs, nil
}

// The ranks' timer slack (Spec.TimerSlack). A rank that waits by sleeping
// briefly in a loop — Open MPI's start-up waits sleep 100 µs between
// looks — wakes 10,000 times a second; on a node with more ranks than
// CPUs those wakes take the CPUs from the ranks still starting (an Open
// MPI hello of 128 ranks on 2 CPUs: 10.3 s with the kernel's 50 µs slack,
// 3.9 s with 1 ms; docs/benchmarks.md). A slack lets the kernel end such
// sleeps together, each later by at most the slack; waits for an event
// (a futex, a socket) are not delayed.
const (
	// TimerSlackAuto sets DefaultTimerSlack on a node that runs more
	// ranks than it may use CPUs, and leaves the ranks their own
	// elsewhere (each has a CPU to wake on).
	TimerSlackAuto time.Duration = 0
	// TimerSlackOff leaves every rank its own: pmirun's or the agent's,
	// inherited.
	TimerSlackOff     time.Duration = -1
	DefaultTimerSlack               = time.Millisecond
	MaxTimerSlack                   = time.Second
)

// rankSlack is the timer slack a node's ranks start with (sys.ForkAttr;
// 0 = their own) when the job asks for ask (Spec.TimerSlack), on a node
// that is oversubscribed or not.
func rankSlack(ask time.Duration, oversubscribed bool) time.Duration {
	switch {
	case ask > 0:
		return ask
	case ask == TimerSlackAuto && oversubscribed:
		return DefaultTimerSlack
	}
	return 0
}
