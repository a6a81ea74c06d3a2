package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// foreignLauncher serves one rank of one over PMI-2 as a launcher without
// fastpmi's extensions does (as Slurm's and Hydra's servers answer):
// every kvs-get finds nothing, every other command succeeds. It counts
// the kvs-gets. The rank is this process: Init reads PMI_FD, which
// names the rank's end of a real socket.
type foreignLauncher struct {
	mu   sync.Mutex
	gets int
	done chan struct{}
}

// startForeign starts a foreignLauncher and points this process's
// launcher variables at it; env adds variables (SLURM_STEP_ID names the
// launcher Slurm).
func startForeign(t *testing.T, env ...string) *foreignLauncher {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "launcher"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rank, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rank.Close()
	srv, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	f, err := rank.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	for _, kv := range append([]string{"PMI_FD=" + strconv.Itoa(int(f.Fd())), "PMI_RANK=0", "PMI_SIZE=1",
		"MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1"}, env...) {
		k, v, _ := cutEnv(kv)
		t.Setenv(k, v)
	}
	if v, ok := os.LookupEnv("FASTPMI_SHM_FD"); ok {
		os.Unsetenv("FASTPMI_SHM_FD")
		t.Cleanup(func() { os.Setenv("FASTPMI_SHM_FD", v) })
	}
	client.ForgetLauncher()
	t.Cleanup(client.ForgetLauncher)
	fl := &foreignLauncher{done: make(chan struct{})}
	go fl.serve(srv)
	t.Cleanup(func() {
		srv.Close()
		<-fl.done
	})
	return fl
}

func cutEnv(kv string) (k, v string, ok bool) {
	for i := range len(kv) {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

func (fl *foreignLauncher) serve(c net.Conn) {
	defer close(fl.done)
	var d pmiwire.Decoder
	var out []byte
	for {
		m, ok, err := d.Next()
		if err != nil {
			return
		}
		if !ok {
			if _, err := d.Fill(c); err != nil {
				return
			}
			continue
		}
		if m.Cmd == "init" { // PMI-1's line, before PMI-2's frames
			out = pmiwire.AppendV1(out[:0], "response_to_init", pmiwire.Pair{Key: "rc", Val: "0"},
				pmiwire.Pair{Key: "pmi_version", Val: "2"}, pmiwire.Pair{Key: "pmi_subversion", Val: "0"})
			if _, err := c.Write(out); err != nil {
				return
			}
			continue
		}
		pairs := []pmiwire.Pair{{Key: "rc", Val: "0"}}
		if id, ok := m.Get("thrid"); ok {
			pairs = append(pairs, pmiwire.Pair{Key: "thrid", Val: id})
		}
		switch m.Cmd {
		case "fullinit":
			pairs = append(pairs, pmiwire.Pair{Key: "rank", Val: "0"}, pmiwire.Pair{Key: "size", Val: "1"},
				pmiwire.Pair{Key: "appnum", Val: "0"}, pmiwire.Pair{Key: "pmi-version", Val: "2"},
				pmiwire.Pair{Key: "pmi-subversion", Val: "0"})
		case "kvs-get":
			fl.mu.Lock()
			fl.gets++
			fl.mu.Unlock()
			pairs = append(pairs, pmiwire.Pair{Key: "found", Val: "FALSE"})
		}
		out = pmiwire.AppendV2(out[:0], m.Cmd+"-response", pairs...)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func (fl *foreignLauncher) kvsGets() int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.gets
}

// TestWaitingGetBacksOff: a get that waits for a late put, under a
// launcher that cannot park it (Slurm's, here), polls it ever less often:
// 300 ms of waiting asked it at most 20 times, where a poll every
// millisecond asked it about 300 times (64 ranks waiting on a launcher's
// one thread: 64,000 requests a second).
func TestWaitingGetBacksOff(t *testing.T) {
	fl := startForeign(t, "SLURM_STEP_ID=0")
	c, err := client.Init()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if v, err := c.Get(ctx, "late", client.WaitForPut()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiting get of a key never put: %q, %v; want the context's deadline", v, err)
	}
	if n := fl.kvsGets(); n < 2 || n > 20 {
		t.Errorf("a waiting get asked the launcher %d times in 300 ms, want 2 to 20", n)
	}
	if err := c.Finalize(); err != nil {
		t.Error(err)
	}
}
