package shm

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
)

// Child processes: the test binary re-executes itself with envChild naming
// what the child does; TestMain runs that instead of the tests. The
// segment arrives as descriptor 3 (exec.Cmd.ExtraFiles[0]).
const (
	envChild  = "FASTPMI_SHM_CHILD"  // child mode: "stress", "pingpong", "allgather"
	envRank   = "FASTPMI_SHM_RANK"   // local rank of the child
	envRounds = "FASTPMI_SHM_ROUNDS" // iterations, for benchmark children
	envSpin   = "FASTPMI_SHM_SPIN"   // waiter spins for the child; unset: NewWaiter's choice
	childFD   = 3
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		if err := runChild(mode); err != nil {
			fmt.Fprintf(os.Stderr, "shm child %s rank %s: %v\n", mode, os.Getenv(envRank), err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runChild(mode string) error {
	i, err := strconv.Atoi(os.Getenv(envRank))
	if err != nil {
		return fmt.Errorf("read %s: %w", envRank, err)
	}
	seg, err := Open(childFD)
	if err != nil {
		return err
	}
	defer seg.Close()
	if s := os.Getenv(envSpin); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("read %s: %w", envSpin, err)
		}
		seg.SetWaiter(SpinWaiter(n))
	}
	r := seg.Rank(i)
	if r == nil {
		return fmt.Errorf("rank %d out of range", i)
	}
	r.Announce()
	rounds, _ := strconv.Atoi(os.Getenv(envRounds))
	switch mode {
	case "stress":
		err = stressChild(r)
	case "pingpong":
		err = pingPongChild(r, rounds)
	case "allgather":
		err = allgatherChild(r, rounds)
	default:
		err = fmt.Errorf("unknown child mode %q", mode)
	}
	if err != nil {
		r.SetState(RankAborted)
		return err
	}
	r.SetState(RankFinalized)
	return nil
}

// startChildren starts n children in mode, each with the segment's memfd
// as descriptor 3 and env added to its environment, and returns a channel
// that yields each child's exit (nil or an error naming the child). When
// the test ends, children still running are killed and reaped.
func startChildren(tb testing.TB, seg *Segment, mode string, n int, env ...string) <-chan error {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, n)
	var wg sync.WaitGroup
	cmds := make([]*exec.Cmd, 0, n)
	tb.Cleanup(func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill() // fails harmlessly for children that have exited
		}
		wg.Wait()
	})
	for i := range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), envChild+"="+mode, envRank+"="+strconv.Itoa(i))
		cmd.Env = append(cmd.Env, env...)
		cmd.ExtraFiles = []*os.File{seg.File()}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			tb.Fatalf("start child %d: %v", i, err)
		}
		cmds = append(cmds, cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("child %d: %w", i, err)
			}
			done <- err
		}()
	}
	return done
}
