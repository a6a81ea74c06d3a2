package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/shm"
)

// Benchmarks with real processes. BenchmarkOps launches a job of p ranks
// of this test binary (launch.Run: the agent runs in this process); every
// rank runs benchWarmup untimed rounds, a fence, b.N timed rounds, and
// appends one line of its measurements to a file:
//
//	rank startNs endNs cpuNs mallocs agentCpuNs
//
// start and end are wall-clock times around the timed rounds; cpu is the
// rank's on-CPU time over them (from /proc/self/task/*/schedstat, ns
// resolution: the clock-tick counters of /proc/self/stat are 10 ms coarse),
// mallocs its heap allocations (runtime.MemStats.Mallocs). Rank 0 also
// reads the agent's on-CPU time (this process, its parent) over the same
// rounds plus one closing fence. The parent reports, per operation:
//
//	ns/op-rank-max   first rank in to last rank out, divided by b.N
//	rank-cpu-us/op   mean over ranks of CPU time per operation
//	rank-allocs/op   mean over ranks of allocations per operation
//	agent-cpu-us/op  the agent's CPU time per operation

// benchWarmup rounds precede the timed ones in every rank.
const benchWarmup = 5

// benchValueLen is the value size of the benchmarked operations.
const benchValueLen = 64

// benchOps are the benchmarked operations, by name.
var benchOps = map[string]func(ctx context.Context, c *client.Client, me, n, round int) error{
	"allgather":  benchAllgather,
	"kvs":        benchKVS,
	"ring":       benchRing,
	"iallgather": benchIallgather,
}

const benchPrefix = "bench-"

func isBenchOp(s string) bool { return strings.HasPrefix(s, benchPrefix) || s == "futexchain" }

// benchValue is rank me's 64-byte value for round: its first bytes name
// the round and the rank, so a stale or misplaced value shows.
func benchValue(dst []byte, me, round int) []byte {
	dst = roundPrefix(dst[:0], round, me)
	for len(dst) < benchValueLen {
		dst = append(dst, 'v')
	}
	return dst
}

// roundPrefix appends "round.rank." without allocating.
func roundPrefix(dst []byte, round, r int) []byte {
	dst = strconv.AppendInt(dst, int64(round), 10)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, int64(r), 10)
	return append(dst, '.')
}

// checkBench checks every rank's value of round in vals (the cheap way: its
// length and prefix).
func checkBench(vals client.Values, n, round int) error {
	if vals.Len() != n {
		return fmt.Errorf("round %d: %d values for %d ranks", round, vals.Len(), n)
	}
	var want [24]byte
	for r := range n {
		p := roundPrefix(want[:0], round, r)
		if v := vals.At(r); len(v) != benchValueLen || !bytes.HasPrefix(v, p) {
			return fmt.Errorf("round %d: value of rank %d is %q", round, r, v)
		}
	}
	return nil
}

var benchBuf = make([]byte, 0, benchValueLen)

func benchAllgather(ctx context.Context, c *client.Client, me, n, round int) error {
	benchBuf = benchValue(benchBuf, me, round)
	vals, err := c.Allgather(ctx, benchBuf)
	if err != nil {
		return err
	}
	return checkBench(vals, n, round)
}

func benchIallgather(ctx context.Context, c *client.Client, me, n, round int) error {
	benchBuf = benchValue(benchBuf, me, round)
	req := c.Iallgather(benchBuf)
	if err := req.Wait(ctx); err != nil {
		return err
	}
	return checkBench(req.Values(), n, round)
}

// benchKeys are the ranks' key names, made once.
var benchKeys []string

// benchKVS is the PMI way of an allgather: put, fence, a get of every
// rank's key.
func benchKVS(ctx context.Context, c *client.Client, me, n, round int) error {
	if benchKeys == nil {
		for r := range n {
			benchKeys = append(benchKeys, "bk-"+strconv.Itoa(r))
		}
	}
	benchBuf = benchValue(benchBuf, me, round)
	if err := c.Put(benchKeys[me], benchBuf, client.HintNone); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	var want [24]byte
	for r := range n {
		v, err := c.Get(ctx, benchKeys[r])
		if err != nil {
			return err
		}
		if len(v) != benchValueLen || !bytes.HasPrefix(v, roundPrefix(want[:0], round, r)) {
			return fmt.Errorf("round %d: value of rank %d is %q", round, r, v)
		}
	}
	return nil
}

func benchRing(ctx context.Context, c *client.Client, me, n, round int) error {
	benchBuf = benchValue(benchBuf, me, round)
	rr, err := c.Ring(ctx, benchBuf)
	if err != nil {
		return err
	}
	if rr.Size != n || len(rr.Left) != benchValueLen || len(rr.Right) != benchValueLen {
		return fmt.Errorf("round %d: ring %d of %d, values of %d and %d bytes", round, rr.Rank, rr.Size, len(rr.Left), len(rr.Right))
	}
	return nil
}

// benchConfig is what envBench passes to benchmark ranks.
type benchConfig struct {
	rounds    int
	out       string // results file
	parentPID int    // the agent's process
}

func (c benchConfig) env() string {
	return fmt.Sprintf("%s=%d,%d,%s", envBench, c.rounds, c.parentPID, c.out)
}

func readBenchConfig() (benchConfig, error) {
	f := strings.SplitN(os.Getenv(envBench), ",", 3)
	if len(f) != 3 {
		return benchConfig{}, fmt.Errorf("bad %s=%q", envBench, os.Getenv(envBench))
	}
	var c benchConfig
	var err1, err2 error
	c.rounds, err1 = strconv.Atoi(f[0])
	c.parentPID, err2 = strconv.Atoi(f[1])
	c.out = f[2]
	if err := errors.Join(err1, err2); err != nil {
		return c, fmt.Errorf("bad %s: %w", envBench, err)
	}
	return c, nil
}

// runBenchRank runs benchmark op s as a rank (or a futex chain member).
func runBenchRank(s string) error {
	cfg, err := readBenchConfig()
	if err != nil {
		return err
	}
	if s == "futexchain" {
		return runChainMember(cfg)
	}
	op := benchOps[strings.TrimPrefix(s, benchPrefix)]
	if op == nil {
		return fmt.Errorf("unknown benchmark op %q", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	me, n := c.Rank(), c.Size()
	for k := range benchWarmup {
		if err := op(ctx, c, me, n, k); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	// The CPU time readers allocate: they stay outside the allocation
	// count.
	var agent0 int64
	if me == 0 {
		agent0, err = cpuNanos(cfg.parentPID)
		if err != nil {
			return err
		}
	}
	cpu0, err := cpuNanos(os.Getpid())
	if err != nil {
		return err
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs0 := ms.Mallocs
	t0 := time.Now()
	for k := range cfg.rounds {
		if err := op(ctx, c, me, n, benchWarmup+k); err != nil {
			return err
		}
	}
	t1 := time.Now()
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs - mallocs0
	cpu1, err := cpuNanos(os.Getpid())
	if err != nil {
		return err
	}
	// Every rank is done once this fence completes: rank 0 then reads
	// the agent's CPU time.
	if err := c.Fence(ctx); err != nil {
		return err
	}
	var agentCPU int64
	if me == 0 {
		a1, err := cpuNanos(cfg.parentPID)
		if err != nil {
			return err
		}
		agentCPU = a1 - agent0
	}
	line := fmt.Sprintf("%d %d %d %d %d %d\n", me, t0.UnixNano(), t1.UnixNano(), cpu1-cpu0, mallocs, agentCPU)
	if err := appendLine(cfg.out, line); err != nil {
		return err
	}
	return c.Finalize()
}

// appendLine appends line to file in one write (O_APPEND: lines of
// concurrent ranks do not mix).
func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuNanos is process pid's on-CPU time in ns: the sum over its live
// threads of the first field of /proc/PID/task/TID/schedstat. Threads
// that exited are missed; Go keeps its threads, so that is rare.
func cpuNanos(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("read CPU time: %w", err)
	}
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("read CPU time: empty %s/%s/schedstat", dir, t.Name())
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read CPU time: %w", err)
		}
		sum += v
	}
	return sum, nil
}

// benchResult is one rank's line.
type benchResult struct {
	rank                int
	start, end          int64
	cpu, mallocs, agent int64
}

func readResults(file string, n int) ([]benchResult, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != n {
		return nil, fmt.Errorf("%d result lines for %d ranks", len(lines), n)
	}
	res := make([]benchResult, 0, n)
	seen := make(map[int]bool)
	for _, l := range lines {
		var r benchResult
		if _, err := fmt.Sscan(l, &r.rank, &r.start, &r.end, &r.cpu, &r.mallocs, &r.agent); err != nil {
			return nil, fmt.Errorf("result line %q: %w", l, err)
		}
		if seen[r.rank] || r.end < r.start {
			return nil, fmt.Errorf("bad result line %q", l)
		}
		seen[r.rank] = true
		res = append(res, r)
	}
	return res, nil
}

// BenchmarkOps runs each operation over shared memory and over PMI-2 text
// (NoShm) with p rank processes on this node.
func BenchmarkOps(b *testing.B) {
	for _, op := range []string{"allgather", "kvs", "ring", "iallgather"} {
		for _, tr := range []string{"shm", "text"} {
			for _, p := range []int{2, 8, 16, 64} {
				b.Run(fmt.Sprintf("%s/%s/p=%d", op, tr, p), func(b *testing.B) {
					benchJob(b, op, tr, p)
				})
			}
		}
	}
}

func benchJob(b *testing.B, op, tr string, p int) {
	out := filepath.Join(b.TempDir(), "results")
	cfg := benchConfig{rounds: b.N, out: out, parentPID: os.Getpid()}
	j := job{scenario: benchPrefix + op, n: p, transport: tr, env: []string{cfg.env()}}
	if text, err := j.run(b); err != nil {
		b.Fatalf("%v\n%s", err, strings.TrimSpace(text))
	}
	res, err := readResults(out, p)
	if err != nil {
		b.Fatal(err)
	}
	first, last := res[0].start, res[0].end
	var cpu, mallocs, agent int64
	for _, r := range res {
		first, last = min(first, r.start), max(last, r.end)
		cpu += r.cpu
		mallocs += r.mallocs
		agent += r.agent // only rank 0's is non-zero
	}
	n := float64(b.N)
	b.ReportMetric(float64(last-first)/n, "ns/op-rank-max")
	b.ReportMetric(float64(cpu)/float64(p)/n/1e3, "rank-cpu-us/op")
	b.ReportMetric(float64(mallocs)/float64(p)/n, "rank-allocs/op")
	b.ReportMetric(float64(agent)/n/1e3, "agent-cpu-us/op")
	// The framework's ns/op would time the whole job, start-up included.
	b.ReportMetric(float64(last-first)/n, "ns/op")
}

// BenchmarkFutexChain is the floor an allgather over shared memory is
// measured against: p processes pass a token around a ring of futex
// hand-offs through the segment's rings (member i waits on its response
// ring and pushes into member i+1's), sleeping at once as the client does
// when ranks outnumber CPUs. One op is one lap, p hand-offs.
func BenchmarkFutexChain(b *testing.B) {
	for _, p := range []int{16} {
		b.Run("p="+strconv.Itoa(p), func(b *testing.B) {
			seg, err := shm.Create(shm.Params{LocalRanks: p, WorldSize: p, KVSCapacity: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer seg.Close()
			exe, err := os.Executable()
			if err != nil {
				b.Fatal(err)
			}
			out := filepath.Join(b.TempDir(), "results")
			cfg := benchConfig{rounds: b.N, out: out, parentPID: os.Getpid()}
			var wg sync.WaitGroup
			errs := make(chan error, p)
			var cmds []*exec.Cmd
			for i := range p {
				cmd := exec.Command(exe)
				cmd.Env = append(os.Environ(), envScenario+"=futexchain", cfg.env(),
					"PMI_RANK="+strconv.Itoa(i), "PMI_SIZE="+strconv.Itoa(p))
				cmd.ExtraFiles = []*os.File{seg.File()} // descriptor 3
				var stderr syncbuf.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				cmds = append(cmds, cmd)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := cmd.Wait(); err != nil {
						errs <- fmt.Errorf("chain member %d: %v: %s", i, err, stderr.String())
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				for _, c := range cmds {
					_ = c.Process.Kill()
				}
				<-done
				b.Fatal("futex chain did not finish in 2 minutes")
			}
			close(errs)
			for err := range errs {
				b.Error(err)
			}
			if b.Failed() {
				return
			}
			res, err := readResults(out, 1)
			if err != nil {
				b.Fatal(err)
			}
			lap := float64(res[0].end-res[0].start) / float64(b.N)
			b.ReportMetric(lap, "ns/lap")
			b.ReportMetric(lap/float64(p), "ns/handoff")
			b.ReportMetric(lap, "ns/op")
		})
	}
}

// runChainMember is member PMI_RANK of the futex chain; member 0 starts
// every lap and times them.
func runChainMember(cfg benchConfig) error {
	i, err := strconv.Atoi(os.Getenv("PMI_RANK"))
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(os.Getenv("PMI_SIZE"))
	if err != nil {
		return err
	}
	seg, err := shm.Open(3)
	if err != nil {
		return err
	}
	defer seg.Close()
	seg.SetWaiter(shm.NewWaiter(p + 1))
	in := seg.Rank(i).Responses()
	next := seg.Agent().Responses((i + 1) % p)
	const timeout = time.Minute
	var t0 time.Time
	for k := range benchWarmup + cfg.rounds {
		if i == 0 {
			if k == benchWarmup {
				t0 = time.Now()
			}
			if err := next.Push(shm.Header{Seq: uint32(k)}, nil); err != nil {
				return fmt.Errorf("lap %d: %w", k, err)
			}
		}
		if err := in.Wait(timeout); err != nil {
			return fmt.Errorf("lap %d: %w", k, err)
		}
		m, err := in.Peek()
		if err != nil || m.Seq != uint32(k) {
			return fmt.Errorf("lap %d: token %+v, %v", k, m.Header, err)
		}
		in.Release()
		if i != 0 {
			if err := next.Push(shm.Header{Seq: uint32(k)}, nil); err != nil {
				return fmt.Errorf("lap %d: %w", k, err)
			}
		}
	}
	if i == 0 {
		return appendLine(cfg.out, fmt.Sprintf("0 %d %d 0 0 0\n", t0.UnixNano(), time.Now().UnixNano()))
	}
	return nil
}
