package client_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/pmiwire/pmiwiretest"
)

// TestWaitingGetBacksOff: a get that waits for a late put, under a
// launcher that cannot park it (Slurm's, played on a real socket: every
// kvs-get finds nothing), polls it ever less often: 300 ms of waiting
// asked it at most 20 times, where a poll every millisecond asked it
// about 300 times (64 ranks waiting on a launcher's one thread: 64,000
// requests a second). The rank is this process.
func TestWaitingGetBacksOff(t *testing.T) {
	srv, rank := pmiwiretest.RankSocket(t)
	for k, v := range map[string]string{"PMI_FD": strconv.Itoa(int(rank.Fd())), "PMI_RANK": "0", "PMI_SIZE": "1",
		"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1", "SLURM_STEP_ID": "0"} {
		t.Setenv(k, v)
	}
	if v, ok := os.LookupEnv("FASTPMI_SHM_FD"); ok {
		os.Unsetenv("FASTPMI_SHM_FD")
		t.Cleanup(func() { os.Setenv("FASTPMI_SHM_FD", v) })
	}
	client.ForgetLauncher()
	t.Cleanup(client.ForgetLauncher)
	var gets atomic.Int64
	pmiwiretest.Start(t, srv, func(m *pmiwire.Msg) []pmiwire.Pair {
		if m.Cmd != "kvs-get" {
			return nil
		}
		gets.Add(1)
		return []pmiwire.Pair{{Key: "found", Val: "FALSE"}}
	})
	c, err := client.Init()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if v, err := c.Get(ctx, "late", client.WaitForPut()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiting get of a key never put: %q, %v; want the context's deadline", v, err)
	}
	if n := gets.Load(); n < 2 || n > 20 {
		t.Errorf("a waiting get asked the launcher %d times in 300 ms, want 2 to 20", n)
	}
	if err := c.Finalize(); err != nil {
		t.Error(err)
	}
}
