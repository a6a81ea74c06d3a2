package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("cannot list %s: %v", dir, err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestCreateLeavesNoFile checks that a segment is a memfd: nothing appears
// in /dev/shm while it exists, its descriptor names a memfd, its size is
// sealed, and closing it releases the descriptor.
func TestCreateLeavesNoFile(t *testing.T) {
	before := listDir(t, "/dev/shm")
	fdsBefore := listDir(t, "/proc/self/fd")
	seg, err := Create(Params{LocalRanks: 4, WorldSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	if during := listDir(t, "/dev/shm"); !slices.Equal(before, during) {
		t.Fatalf("/dev/shm changed: %v -> %v", before, during)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(seg.File().Fd())))
	if err != nil || !strings.HasPrefix(link, "/memfd:fastpmi-shm") {
		t.Fatalf("segment descriptor is %q (%v), want a memfd", link, err)
	}
	if err := seg.File().Truncate(1 << 20); err == nil {
		t.Fatal("truncating the sealed segment succeeded")
	}
	fi, err := seg.File().Stat()
	if err != nil || fi.Size() != int64(len(seg.Bytes())) {
		t.Fatalf("memfd size %v (%v), mapping %d", fi.Size(), err, len(seg.Bytes()))
	}
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := seg.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if after := listDir(t, "/dev/shm"); !slices.Equal(before, after) {
		t.Fatalf("/dev/shm changed: %v -> %v", before, after)
	}
	if fdsAfter := listDir(t, "/proc/self/fd"); len(fdsAfter) != len(fdsBefore) {
		t.Fatalf("descriptors: %d before, %d after close", len(fdsBefore), len(fdsAfter))
	}
}

// copySegment returns a fresh memfd holding a copy of seg's bytes, edited
// by edit and truncated to size (0: the same size).
func copySegment(t *testing.T, seg *Segment, size int64, edit func(b []byte)) *os.File {
	t.Helper()
	f, err := sys.MemfdCreate("fastpmi-shm-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	b := slices.Clone(seg.Bytes())
	edit(b)
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if size != 0 {
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestOpenValidatesHeader(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 2, WorldSize: 8, MaxValue: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	total := int64(len(seg.Bytes()))
	le := binary.LittleEndian
	cases := []struct {
		name string
		size int64
		edit func(b []byte)
		want string // "" means success
	}{
		{"valid", 0, func([]byte) {}, ""},
		{"magic", 0, func(b []byte) { b[0] ^= 1 }, "map segment: bad magic"},
		{"version", 0, func(b []byte) { le.PutUint32(b[hdrVersion:], 1) }, fmt.Sprintf("map segment: layout version 1, want %d", LayoutVersion)},
		{"arena size", 0, func(b []byte) { le.PutUint32(b[hdrKVSArenaPages:], le.Uint32(b[hdrKVSArenaPages:])+1) }, "header total length"},
		{"no arena", 0, func(b []byte) { le.PutUint32(b[hdrKVSArenaPages:], 0) }, "zero size field"},
		{"header size", 0, func(b []byte) { le.PutUint32(b[hdrHeaderBytes:], 64) }, "header of 64 bytes"},
		{"zero ranks", 0, func(b []byte) { le.PutUint32(b[hdrLocalRanks:], 0) }, "zero size field"},
		{"world below local", 0, func(b []byte) { le.PutUint32(b[hdrWorldSize:], 1) }, "world size 1"},
		{"ring not power of two", 0, func(b []byte) { le.PutUint32(b[hdrReqRingBytes:], 3000) }, "request ring 3000 bytes"},
		{"moved offset", 0, func(b []byte) { le.PutUint64(b[hdrResultOff:], le.Uint64(b[hdrResultOff:])+64) }, "header result offset"},
		{"stride", 0, func(b []byte) { le.PutUint32(b[hdrResultStride:], 8) }, "header result stride 8"},
		{"more ranks than space", 0, func(b []byte) { le.PutUint32(b[hdrLocalRanks:], 8) }, "header total length"},
		{"short file", total - 4096, func([]byte) {}, "segment has"},
		{"long file", total + 4096, func([]byte) {}, "segment has"},
		{"tiny file", 100, func([]byte) {}, "cannot hold a segment"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := copySegment(t, seg, tc.size, tc.edit)
			s, err := OpenFile(f)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if s.Params().WorldSize != 8 || s.Params().MaxValue != 100 {
					t.Fatalf("params %+v", s.Params())
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("opened a segment with a bad %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "map segment: ") {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestParamsValidate(t *testing.T) {
	bad := []Params{
		{},
		{LocalRanks: 4, WorldSize: 3},
		{LocalRanks: 1, MaxValue: maxValueBytes + 1},
		{LocalRanks: 1, RequestRingBytes: 1000},
		{LocalRanks: 1, ResponseRingBytes: 128},
		{LocalRanks: 1, KVSKeyMax: -1},
		{LocalRanks: 1, RingBase: 8},
		{LocalRanks: maxLocalRanks, WorldSize: maxWorldSize, MaxValue: maxValueBytes}, // over maxTotal
	}
	for _, p := range bad {
		if _, err := Size(p); err == nil {
			t.Errorf("Size(%+v) accepted bad params", p)
		}
		if _, err := NewHeap(p); err == nil {
			t.Errorf("NewHeap(%+v) accepted bad params", p)
		}
	}
	if _, err := FromBytes(make([]byte, 100), Params{LocalRanks: 1}); err == nil {
		t.Error("FromBytes accepted a short buffer")
	}
	n, _ := Size(Params{LocalRanks: 1})
	if _, err := FromBytes(alignedBytes(n + 1)[1:], Params{LocalRanks: 1}); err == nil {
		t.Error("FromBytes accepted a misaligned buffer")
	}
}

// TestLayoutGeometry checks, for a spread of sizes, that regions are in
// order, aligned, disjoint and inside the total, and that every atomic
// word is aligned for its width.
func TestLayoutGeometry(t *testing.T) {
	for _, p := range []Params{
		{LocalRanks: 1},
		{LocalRanks: 3, WorldSize: 1000, MaxValue: 1, KVSCapacity: 1, KVSKeyMax: 1},
		{LocalRanks: 64, WorldSize: 1 << 16, MaxValue: 257, RequestRingBytes: 1 << 20},
	} {
		p, err := p.validate()
		if err != nil {
			t.Fatal(err)
		}
		l, err := computeLayout(p)
		if err != nil {
			t.Fatal(err)
		}
		ends := []uint64{
			headerBytes, l.ctrlOff, l.ctrlOff + uint64(p.LocalRanks)*ctrlStride,
			l.ringOff, l.ringOff + uint64(p.LocalRanks)*l.ringStride,
			l.slotOff, l.slotOff + 2*uint64(p.LocalRanks)*l.slotBytes,
			l.resultOff, l.resultOff + 2*l.resultBufBytes,
			l.kvsIndexOff, l.kvsIndexOff + 4*uint64(l.kvsBuckets),
			l.kvsEntryOff, l.kvsEntryOff + uint64(p.KVSCapacity)*kvsEntryBytes,
			l.kvsArenaOff, l.kvsArenaOff + l.kvsArena, l.total,
		}
		if !slices.IsSorted(ends) {
			t.Errorf("%+v: regions overlap or are out of order: %v", p, ends)
		}
		for _, off := range []uint64{l.ctrlOff, l.ringOff, l.slotOff, l.resultOff, l.kvsIndexOff, l.kvsEntryOff, l.kvsArenaOff, l.total} {
			if off%regionAlign != 0 {
				t.Errorf("%+v: region at %d is not %d-aligned", p, off, regionAlign)
			}
		}
		if l.slotBytes%CacheLine != 0 || l.resultStride%8 != 0 || uint64(l.kvsBuckets) < 2*uint64(p.KVSCapacity) {
			t.Errorf("%+v: strides %d %d, %d buckets", p, l.slotBytes, l.resultStride, l.kvsBuckets)
		}
		if l.kvsArena < uint64(p.KVSKeyMax+p.MaxValue) || l.kvsArena%regionAlign != 0 {
			t.Errorf("%+v: kvs arena of %d bytes cannot hold one maximal key and value", p, l.kvsArena)
		}
		if l.resultBufBytes < uint64(p.WorldSize)*(resData+uint64(p.MaxValue)) {
			t.Errorf("%+v: result buffer of %d bytes is too small", p, l.resultBufBytes)
		}
	}
}

// TestFutexAcrossMappings checks the shared futex: a waiter sleeping on a
// word through one mapping of a memfd is woken by a waker using another
// mapping of it, and a timed wait times out.
func TestFutexAcrossMappings(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 1, KVSCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	other, err := OpenFile(seg.File())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if &seg.Bytes()[0] == &other.Bytes()[0] {
		t.Fatal("two mappings share an address")
	}
	w1, w2 := seg.u32(offDoorbell), other.u32(offDoorbell)
	start := time.Now()
	if err := sys.FutexWait(futexAddr(w1), w1.Load(), 20*time.Millisecond); !errors.Is(err, sys.ErrTimedOut) {
		t.Fatalf("timed wait: %v", err)
	}
	if el := time.Since(start); el < 15*time.Millisecond {
		t.Fatalf("timed wait returned after %v", el)
	}
	if err := sys.FutexWait(futexAddr(w1), w1.Load()+1, time.Second); err != nil {
		t.Fatalf("wait on a changed word: %v", err)
	}
	// Wake a waiter on w1 through w2. The waiter may not be asleep yet when
	// the store lands (it then returns at once, as futexes do); only a
	// wake that reached a sleeper counts, so retry until one does.
	for attempt := 0; ; attempt++ {
		if attempt == 50 {
			t.Fatal("no waiter was asleep in 50 attempts")
		}
		w2.Store(0)
		var woke atomic.Bool
		done := make(chan error, 1)
		go func() {
			err := sys.FutexWait(futexAddr(w1), 0, 10*time.Second)
			woke.Store(w1.Load() == 1)
			done <- err
		}()
		time.Sleep(time.Duration(attempt+1) * time.Millisecond)
		w2.Store(1)
		n, err := sys.FutexWake(futexAddr(w2), 1)
		if err != nil {
			t.Fatal(err)
		}
		err = <-done // it returns either way: woken, or the word had changed
		if n == 1 {
			if err != nil || !woke.Load() {
				t.Fatalf("woken waiter: %v, saw the store: %v", err, woke.Load())
			}
			return
		}
	}
}

func TestWaiterPolicy(t *testing.T) {
	n, err := sys.OnlineCPUs()
	if err != nil || n < 1 {
		t.Fatalf("online cpus: %d %v", n, err)
	}
	if NewWaiter(n).Spins() == 0 {
		t.Errorf("%d parties on %d cpus: waiter does not spin", n, n)
	}
	if NewWaiter(n+1).Spins() != 0 {
		t.Errorf("%d parties on %d cpus: waiter spins", n+1, n)
	}
	// A timed wait that never becomes ready reports ErrTimeout, both ways.
	seg, _ := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
	for _, w := range []Waiter{{}, SpinWaiter(100), InProcessWaiter()} {
		seg.SetWaiter(w)
		start := time.Now()
		if err := seg.Rank(0).WaitEpoch(5, 10*time.Millisecond); err != ErrTimeout {
			t.Fatalf("waiter %+v: %v", w, err)
		}
		if el := time.Since(start); el < 10*time.Millisecond || el > 2*time.Second {
			t.Fatalf("waiter %+v: timed out after %v", w, el)
		}
		if seg.u32(offEpochSleepers).Load() != 0 {
			t.Fatal("sleeper count not restored after a timeout")
		}
	}
}

// TestHotPathAllocs checks that pushing, popping, slot and result access,
// publishing and lookups allocate nothing.
func TestHotPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	seg, err := NewHeap(Params{LocalRanks: 1, WorldSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	a, r := seg.Agent(), seg.Rank(0)
	if err := a.KVSPut([]byte("key"), []byte("value"), 0); err != nil {
		t.Fatal(err)
	}
	ready := make([]int, 0, 1)
	payload := []byte("payload")
	e := uint32(0)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := r.SetSlot(e, payload); err != nil {
			t.Fatal(err)
		}
		if err := r.Requests().PushWait(Header{Op: 1, Epoch: e}, payload, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := a.Wait(time.Second); err != nil {
			t.Fatal(err)
		}
		if ready = a.TakeReady(ready[:0]); len(ready) != 1 || ready[0] != 0 {
			t.Fatalf("ready ranks %v, want [0]", ready)
		}
		m, err := a.Requests(0).Peek()
		if err != nil {
			t.Fatal(err)
		}
		v, err := a.Slot(0, m.Epoch)
		if err != nil {
			t.Fatal(err)
		}
		for g := range 4 {
			if err := a.SetResult(g, e, v); err != nil {
				t.Fatal(err)
			}
		}
		a.Requests(0).Release()
		a.Publish(e)
		if err := r.WaitEpoch(e, time.Second); err != nil {
			t.Fatal(err)
		}
		if v, err := r.Result(3, e); err != nil || len(v) != len(payload) {
			t.Fatal(err)
		}
		if _, ok := r.Lookup([]byte("key")); !ok {
			t.Fatal("lookup failed")
		}
		e++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round", allocs)
	}
}

func TestKVS(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 3, KVSKeyMax: 8, MaxValue: 16, FirstEpoch: 10})
	if err != nil {
		t.Fatal(err)
	}
	a, r := seg.Agent(), seg.Rank(0)
	for i, k := range []string{"a", "bb", "ccc"} {
		if err := a.KVSPut([]byte(k), []byte("v"+k), 10+uint32(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.KVSPut([]byte("bb"), nil, 12); err != ErrKeyExists {
		t.Fatalf("duplicate put: %v", err)
	}
	if err := a.KVSPut([]byte("dddd"), nil, 12); err != ErrKVSFull {
		t.Fatalf("put into a full table: %v", err)
	}
	if err := a.KVSPut([]byte("123456789"), nil, 12); err != ErrTooLarge {
		t.Fatalf("long key: %v", err)
	}
	if _, ok := r.Lookup([]byte("a")); ok {
		t.Fatal("key visible before its epoch was published")
	}
	a.Publish(10)
	if v, ok := r.Lookup([]byte("a")); !ok || string(v) != "va" {
		t.Fatalf("lookup a: %q %v", v, ok)
	}
	if _, ok := r.Lookup([]byte("bb")); ok {
		t.Fatal("key of epoch 11 visible at epoch 10")
	}
	a.Publish(12)
	for _, k := range []string{"a", "bb", "ccc"} {
		if v, ok := r.Lookup([]byte(k)); !ok || string(v) != "v"+k {
			t.Fatalf("lookup %s: %q %v", k, v, ok)
		}
	}
	if v, e, ok := a.KVSGet([]byte("ccc")); !ok || e != 12 || string(v) != "vccc" {
		t.Fatalf("agent get: %q %d %v", v, e, ok)
	}
	if _, ok := r.Lookup([]byte("zz")); ok {
		t.Fatal("lookup of a missing key succeeded")
	}
	// A rank opening the segment later sees the same table.
	view, err := Attach(seg.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := view.Rank(0).Lookup([]byte("bb")); !ok || string(v) != "vbb" {
		t.Fatalf("lookup through another view: %q %v", v, ok)
	}
	if view.Agent().KVSLen() != 3 {
		t.Fatalf("another view's agent counts %d entries", view.Agent().KVSLen())
	}
}

// TestSleepPrepare checks the split wait an io_uring agent uses: a push
// after SleepPrepare bumps the doorbell word, so a FUTEX_WAIT on the
// returned value would not sleep; a push before it reports ready.
func TestSleepPrepare(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	a, r := seg.Agent(), seg.Rank(0)
	word, val, ready := a.SleepPrepare()
	if ready {
		t.Fatal("ready with nothing pending")
	}
	if err := r.Requests().Push(Header{Op: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if atomic.LoadUint32(word) == val {
		t.Fatal("push while the agent slept did not ring the doorbell")
	}
	a.SleepDone()
	if _, _, ready := a.SleepPrepare(); !ready {
		t.Fatal("not ready with a request pending")
	}
	a.SleepDone()
	if seg.u32(offAgentSleepers).Load() != 0 {
		t.Fatal("sleeping flag left set")
	}
	if _, err := a.Requests(0).Peek(); err != nil {
		t.Fatal(err)
	}
	a.Requests(0).Release()
	if ready := a.TakeReady(nil); len(ready) != 1 || ready[0] != 0 {
		t.Fatalf("ready ranks %v after a push by rank 0, want [0]", ready)
	}
	if ready := a.TakeReady(nil); len(ready) != 0 {
		t.Fatalf("ready ranks %v after taking them, want none", ready)
	}
	a.Kick()
	if err := a.Wait(0); err != nil {
		t.Fatalf("wait after kick: %v", err)
	}
	if err := a.Wait(time.Millisecond); err != ErrTimeout {
		t.Fatalf("second wait after one kick: %v", err)
	}
}

// osThreads is this process's thread count.
func osThreads(t *testing.T) int {
	n, err := sys.Threads(0)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// In-process waiting: many goroutine ranks sleep on epochs without an OS
// thread each, and every publish wakes all of them; a sleeping agent is
// woken by a rank's push the same way.
func TestInProcessWaiter(t *testing.T) {
	const ranks, rounds = 512, 20
	seg, err := NewHeap(Params{LocalRanks: ranks, KVSCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(InProcessWaiter())
	done := make(chan error, ranks)
	for i := range ranks {
		go func() {
			for e := uint32(1); e <= rounds; e++ {
				if err := seg.Rank(i).WaitEpoch(e, 10*time.Second); err != nil {
					done <- fmt.Errorf("rank %d epoch %d: %w", i, e, err)
					return
				}
			}
			done <- nil
		}()
	}
	sleepers := seg.u32(offEpochSleepers)
	for e := uint32(1); e <= rounds; e++ {
		deadline := time.Now().Add(10 * time.Second)
		for sleepers.Load() != ranks {
			if time.Now().After(deadline) {
				t.Fatalf("epoch %d: %d of %d ranks asleep", e, sleepers.Load(), ranks)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if e == 1 {
			if n := osThreads(t); n >= ranks/4 {
				t.Errorf("%d ranks asleep hold %d OS threads", ranks, n)
			}
		}
		seg.Agent().Publish(e)
	}
	for range ranks {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	// The agent's doorbell: a push from a rank goroutine wakes it.
	woke := make(chan error, 1)
	go func() { woke <- seg.Agent().Wait(10 * time.Second) }()
	time.Sleep(5 * time.Millisecond)
	if err := seg.Rank(3).Requests().Push(Header{Op: OpHello}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent not woken by a rank's push")
	}
}

// The KVS arena holds keys and values at their own size: a small arena
// fills by bytes, not by entries, and a later agent view continues where
// the first stopped.
func TestKVSArena(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1 << 12, KVSKeyMax: 16, MaxValue: 1000, KVSArenaBytes: 4096, FirstEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := seg.Params().KVSArenaBytes; got != 4096 {
		t.Fatalf("arena of %d bytes, want 4096", got)
	}
	a := seg.Agent()
	val := strings.Repeat("v", 56) // key "k-NNN" (5 bytes) + 56 = 61, 64 with alignment
	n := 0
	for ; ; n++ {
		err := a.KVSPut([]byte(fmt.Sprintf("k-%03d", n)), []byte(val), 1)
		if err == ErrKVSFull {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != 4096/64 {
		t.Fatalf("%d entries of 64 arena bytes fit in 4096, want %d", n, 4096/64)
	}
	a.Publish(1)
	for i := range n {
		k := fmt.Sprintf("k-%03d", i)
		if v, ok := seg.Rank(0).Lookup([]byte(k)); !ok || string(v) != val {
			t.Fatalf("lookup %s: %q %v", k, v, ok)
		}
	}
	// Replacing a key needs arena space too: with none left the key is
	// withdrawn (lookups miss, so ranks ask the agent), never stale.
	if err := a.KVSReplace([]byte("k-000"), []byte("new"), 2); err != ErrKVSFull {
		t.Fatalf("replace in a full arena: %v", err)
	}
	if _, ok := seg.Rank(0).Lookup([]byte("k-000")); ok {
		t.Fatal("withdrawn key still visible")
	}
	view, err := Attach(seg.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := view.Agent().KVSPut([]byte("x"), []byte("y"), 2); err != ErrKVSFull {
		t.Fatalf("another agent view put into the full arena: %v", err)
	}
}

// An agent that found no rank since its last Wait sleeps at once, however
// long the segment's waiter may spin: the periodic wake-up of an idle
// agent costs one check (a node of many idle jobs has as many agents).
// Once TakeReady found a rank, the next Wait spins first again.
func TestAgentIdleWaitSleepsAtOnce(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 1, WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	seg.SetWaiter(SpinWaiter(1 << 30)) // spinning through it takes seconds
	ag := seg.Agent()
	start := time.Now()
	if err := ag.Wait(20 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("idle Wait: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("an idle agent's Wait took %v: it spun before sleeping", d)
	}
	if err := seg.Rank(0).Requests().Push(Header{Op: OpHello}, nil); err != nil {
		t.Fatal(err)
	}
	if got := ag.TakeReady(nil); len(got) != 1 || !ag.took {
		t.Fatalf("TakeReady after a push: %v (took %v), want rank 0 taken", got, ag.took)
	}
	seg.SetWaiter(SpinWaiter(16))
	if err := ag.Wait(0); !errors.Is(err, ErrTimeout) || ag.took {
		t.Errorf("Wait after taking work: %v (took %v), want ErrTimeout and took cleared", err, ag.took)
	}
}

// A party that rings a word without end (a rank bumping the doorbell and
// calling FUTEX_WAKE in a loop, which any rank can) does not make its
// sleeper spin with it: past stormWakes wake-ups in a row that found
// nothing to do, the sleeper pauses stormPause before each new sleep, so
// the storm costs it about one check per pause.
func TestWaitUnderWakeStorm(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 1, WorldSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	ev := seg.doorbell()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				ev.wake()
			}
		}
	})
	checks := 0
	ready := func() bool { checks++; return false }
	const d = 300 * time.Millisecond
	var p parker
	err = Waiter{}.wait(ev, ready, &p, context.Background(), d)
	close(stop)
	wg.Wait()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait under a storm: %v, want ErrTimeout", err)
	}
	if limit := 2*int(d/stormPause) + 2*stormWakes; checks > limit {
		t.Errorf("a wait of %v checked its condition %d times under a wake storm, want at most %d", d, checks, limit)
	}
}

// A rank asleep in a wait with no bound (WaitEpoch(e, -1), or a client
// call with context.Background()) is not lost when another rank stores 0
// into the sleepers word its wake depends on (every rank maps the whole
// segment writable): the agent's Publish, seeing no sleeper, wakes
// nobody, and the sleeper finds the epoch at its next slice (ctxSlice)
// instead of never.
func TestWaitSurvivesZeroedSleepers(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 1, WorldSize: 1, FirstEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	seg.SetWaiter(Waiter{})
	done := make(chan error, 1)
	go func() { done <- seg.Rank(0).WaitEpoch(1, -1) }()
	sleepers := seg.u32(offEpochSleepers)
	for deadline := time.Now().Add(5 * time.Second); sleepers.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the rank never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond) // in the futex wait
	sleepers.Store(0)                 // a stray store by another rank
	seg.Agent().Publish(1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitEpoch: %v", err)
		}
	case <-time.After(ctxSlice + 2*time.Second):
		t.Fatal("a rank whose sleepers word was zeroed slept through the epoch's publication")
	}
}

// A rank that overwrites the KVS hash index (a stray memset over its
// mapping: every bucket non-empty) neither makes every later insert of
// the agent scan the whole index nor fills its table: the agent probes
// its own copy of the index, so its inserts stay short and succeed, and
// ranks find the keys put after the damage.
func TestKVSIndexOverwritten(t *testing.T) {
	seg, err := Create(Params{LocalRanks: 1, KVSCapacity: 1 << 18, FirstEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	a, r := seg.Agent(), seg.Rank(0)
	if err := a.KVSPut([]byte("before"), []byte("v"), 1); err != nil {
		t.Fatal(err)
	}
	idx := seg.Bytes()[seg.l.kvsIndexOff : seg.l.kvsIndexOff+4*uint64(seg.l.kvsBuckets)]
	for i := range idx {
		idx[i] = 0xa5 // names no entry (past the capacity), and is never empty
	}
	const n = 2000
	start := time.Now()
	for i := range n {
		if err := a.KVSPut([]byte(fmt.Sprintf("key-%d", i)), []byte("value"), 1); err != nil {
			t.Fatalf("put %d after the index was overwritten: %v", i, err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("%d puts after the index was overwritten took %v: each scanned the index", n, d)
	}
	a.Publish(1)
	if v, ok := r.Lookup([]byte("key-7")); !ok || string(v) != "value" {
		t.Errorf("a rank's lookup of a key put after the damage: %q %v", v, ok)
	}
	if v, _, ok := a.KVSGet([]byte("key-1999")); !ok || string(v) != "value" {
		t.Errorf("the agent's get of a key put after the damage: %q %v", v, ok)
	}
}
