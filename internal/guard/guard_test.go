package guard

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// The test binary is its own guard (Main, with Arg) and, with
// forkerEnv set, a forking process to be killed: it starts a guard,
// forks a shell in a process group of its own the way a node forks a
// rank, registers the group, prints the pids and waits to be killed.
const forkerEnv = "FASTPMI_GUARD_TEST_FORKER"

func TestMain(m *testing.M) {
	Main()
	if os.Getenv(forkerEnv) != "" {
		os.Exit(forker())
	}
	os.Exit(m.Run())
}

// forker is the test binary as a forking process: three "ranks", each a
// shell that starts a background sleep (its grandchild, in its group);
// the first stays registered, the second is registered and removed
// again, the third is forked with a tag (Forking) and not yet
// registered, as a rank is between its fork and its forker's Add. It
// prints "guard G", then "rank R child C kept|removed|forking" for each,
// and sleeps until killed.
func forker() int {
	g, err := New(SelfExe, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	for _, what := range []string{"kept", "removed", "forking"} {
		cmd := exec.Command("sh", "-c", "sleep 300 & echo $!; wait")
		cmd.SysProcAttr = sys.RankProcAttr()
		if what == "forking" {
			tag := NewTag()
			g.Forking(tag)
			cmd.Env = append(os.Environ(), TagVar+"="+tag)
		}
		out, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if what != "forking" {
			g.Add(cmd.Process.Pid)
		}
		child, _ := bufio.NewReader(out).ReadString('\n')
		if what == "removed" {
			g.Remove(cmd.Process.Pid)
		}
		fmt.Printf("rank %d child %s %s\n", cmd.Process.Pid, strings.TrimSpace(child), what)
	}
	fmt.Printf("guard %d\n", waitProc(g, 10*time.Second))
	time.Sleep(5 * time.Minute) // the test kills this process
	return 0
}

// waitProc returns the pid of g's guard process once it runs (0 if it
// does not within d).
func waitProc(g *Guard, d time.Duration) int {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		p := g.proc
		g.mu.Unlock()
		if p != nil {
			return p.Pid
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0
}

// waitIgnoring waits until process pid ignores SIGHUP, SIGINT, SIGQUIT
// and SIGTERM (its SigIgn mask in /proc), up to d.
func waitIgnoring(pid int, d time.Duration) bool {
	// Signal s is bit s-1: SIGHUP 1, SIGINT 2, SIGQUIT 3, SIGTERM 15.
	const want = 1<<0 | 1<<1 | 1<<2 | 1<<14
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			return false
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "SigIgn:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && m&want == want {
					return true
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// zombie reports whether pid has ended but is not reaped.
func zombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(stat, ')')
	return err == nil && i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// alive reports whether pid runs (a zombie has ended).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// waitGone waits until none of pids runs, up to d, and returns those
// still running.
func waitGone(pids []int, d time.Duration) []int {
	deadline := time.Now().Add(d)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killBound is how soon the guard must have killed the groups after its
// forker died: promptly on a quiet machine (a few ms), generously on a
// loaded one.
const killBound = 5 * time.Second

// A forking process killed with SIGKILL takes every process of every
// group it registered with it, the grandchildren the parent-death signal
// misses included, and every process with the tag of ranks it was still
// forking (before, a rank forked but not yet registered, which a busy
// forker leaves so for milliseconds, left its children running); a
// group it removed is left alone. Its guard survives
// the signals a terminal or a kill of the launcher's group send, and ends
// itself once it has killed.
func TestForkerKilled(t *testing.T) {
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), forkerEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var kept, removed, forking []int
	guardPid := 0
	defer func() {
		for _, p := range append(append(append(kept, removed...), forking...), guardPid, cmd.Process.Pid) {
			if p > 0 {
				_ = sys.SignalProcess(p, sys.SIGKILL)
			}
		}
		cmd.Wait()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		br := bufio.NewReader(out)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimSpace(l)
		}
	}()
	timeout := time.After(30 * time.Second)
	for guardPid == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the forker ended before it said its guard's pid")
			}
			f := strings.Fields(l)
			switch {
			case len(f) == 2 && f[0] == "guard":
				guardPid, _ = strconv.Atoi(f[1])
				if guardPid == 0 {
					t.Fatalf("the guard did not start: %q", l)
				}
			case len(f) == 5 && f[0] == "rank":
				r, _ := strconv.Atoi(f[1])
				c, _ := strconv.Atoi(f[3])
				switch f[4] {
				case "kept":
					kept = append(kept, r, c)
				case "forking":
					forking = append(forking, r, c)
				default:
					removed = append(removed, r, c)
				}
			default:
				t.Fatalf("forker said %q", l)
			}
		case <-timeout:
			t.Fatal("the forker said nothing for 30 s")
		}
	}
	if len(kept) != 2 || len(removed) != 2 || len(forking) != 2 {
		t.Fatalf("kept %v, removed %v, forking %v: want a rank and its child each", kept, removed, forking)
	}
	for _, p := range append(append([]int{guardPid}, kept...), removed...) {
		if !alive(p) {
			t.Fatalf("pid %d is not running before the forker is killed", p)
		}
	}
	// What Ctrl-C at a terminal, kill(1) of the launcher and a kill of
	// its process group send: the guard ignores all of them (and is in
	// a group of its own). It does from its main on: wait until it got
	// there.
	if !waitIgnoring(guardPid, 20*time.Second) {
		t.Fatalf("the guard %d does not ignore SIGHUP, SIGINT, SIGQUIT and SIGTERM after 20 s", guardPid)
	}
	// It names itself after its command, not "exe" (/proc/self/exe).
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Base(exe) + "-guard"
	want = want[:min(len(want), 15)]
	comm := ""
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && comm != want; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(guardPid) + "/comm")
		comm = strings.TrimSpace(string(b))
	}
	if comm != want {
		t.Errorf("the guard's name is %q, want %q", comm, want)
	}
	for _, sig := range []os.Signal{sys.SIGINT, sys.SIGTERM, sys.SIGHUP, sys.SIGQUIT} {
		if err := sys.SignalGroup(guardPid, sig); err != nil {
			t.Fatalf("signal the guard's group: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(guardPid) {
		t.Fatal("the guard died of SIGINT, SIGTERM, SIGHUP or SIGQUIT")
	}
	if left := waitGone(kept, 0); len(left) != 2 {
		t.Fatalf("registered processes %v ended before the forker was killed (left %v)", kept, left)
	}

	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if left := waitGone(append(kept, guardPid), killBound); len(left) > 0 {
		t.Fatalf("%v still run %v after the forker's SIGKILL (registered rank and child %v, guard %d)", left, killBound, kept, guardPid)
	}
	t.Logf("registered group and guard gone %v after the forker's SIGKILL", time.Since(killed).Round(time.Millisecond))
	if left := waitGone(forking, killBound); len(left) > 0 {
		t.Errorf("%v of a rank forked with a tag and not yet registered (rank and child %v) still run %v after the forker's SIGKILL", left, forking, killBound)
	}
	// The removed rank died of the parent-death signal; its child was
	// not the guard's to kill.
	if !alive(removed[1]) {
		t.Errorf("the child %d of a removed group was killed", removed[1])
	}
}

// groupProc starts a sleep in a process group of its own and returns it
// with a channel closed when it has been reaped.
func groupProc(t *testing.T) (*exec.Cmd, chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = sys.RankProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd, done
}

// Stop is the forker's end as far as its guard can tell: a group still
// registered is killed, a removed one is not, and the guard exits by
// itself. Nothing is written after Stop.
func TestStop(t *testing.T) {
	g, err := New(SelfExe, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept, keptDone := groupProc(t)
	removed, removedDone := groupProc(t)
	if !g.Add(kept.Process.Pid) || !g.Add(removed.Process.Pid) {
		t.Fatal("Add refused with a guard starting")
	}
	// Counted: two adds need two removes.
	g.Add(removed.Process.Pid)
	g.Remove(removed.Process.Pid)
	g.Remove(removed.Process.Pid)
	guardPid := waitProc(g, 20*time.Second)
	if guardPid == 0 {
		t.Fatal("the guard did not start within 20 s")
	}
	g.Stop()
	if left := waitGone([]int{guardPid}, killBound); len(left) > 0 {
		t.Errorf("the guard %d runs %v after Stop", guardPid, killBound)
	}
	g.proc.Wait() // Stop leaves the guard to its parent (init, after a command's exit)
	select {
	case <-keptDone:
	case <-time.After(killBound):
		t.Fatalf("a registered group runs %v after Stop", killBound)
	}
	select {
	case <-removedDone:
		t.Fatal("a removed group was killed")
	case <-time.After(100 * time.Millisecond):
	}
	if g.Add(removed.Process.Pid) {
		t.Error("Add after Stop said the group is registered")
	}
	g.Stop() // idempotent
}

// A guard that cannot start leaves jobs running: Add says the group is
// not registered once the start has failed, and the log says once that
// survivors are not guarded.
func TestStartFails(t *testing.T) {
	var logb syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logb, nil))
	g, err := New("/nonexistent/fastpmi-guard", log)
	if err != nil {
		t.Fatal(err)
	}
	<-g.started
	for range 3 {
		if g.Add(os.Getpid()) {
			t.Fatal("Add said a group is registered with a guard that did not start")
		}
	}
	g.Stop()
	if n := strings.Count(logb.String(), "not guarded"); n != 1 {
		t.Errorf("log says %d times that survivors are not guarded, want once:\n%s", n, logb.String())
	}
}

// A guard that dies is noticed at the next write (logged once), reaped,
// and no longer written to.
func TestGuardDies(t *testing.T) {
	var logb syncbuf.Buffer
	g, err := New(SelfExe, slog.New(slog.NewTextHandler(&logb, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	pid := waitProc(g, 20*time.Second)
	if pid == 0 {
		t.Fatal("the guard did not start within 20 s")
	}
	if err := sys.SignalProcess(pid, sys.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Until the kernel has closed the dead guard's end of the pipe, a
	// write still succeeds.
	deadline := time.Now().Add(killBound)
	for g.Add(os.Getpid()) {
		if time.Now().After(deadline) {
			t.Fatalf("Add still says groups are registered %v after the guard was killed", killBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if g.Add(os.Getpid()) {
		t.Error("Add said a group is registered with a dead guard")
	}
	if n := strings.Count(logb.String(), "not guarded"); n != 1 {
		t.Errorf("log says %d times that survivors are not guarded, want once: %q", n, logb.String())
	}
	g.mu.Lock()
	reaped := g.proc == nil
	g.mu.Unlock()
	if !reaped || alive(pid) || zombie(pid) {
		t.Errorf("the dead guard %d was not reaped", pid)
	}
}

// The guard's protocol: counted registrations, every open group killed
// and every open directory removed once at end-of-file, malformed
// records skipped and reported (the guard keeps guarding the rest).
func TestServe(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		kill     []int
		bad      string   // in the error; "" = no error
		rm       []string // directories removed
	}{
		{"empty", "", nil, "", nil},
		{"add", "+12\n+13\n", []int{12, 13}, "", nil},
		{"removed", "+12\n+13\n-12\n", []int{13}, "", nil},
		{"counted", "+12\n+12\n-12\n", []int{12}, "", nil},
		{"counted out", "+12\n+12\n-12\n-12\n", nil, "", nil},
		{"remove unknown", "-12\n+13\n", []int{13}, `"-12" (not registered)`, nil},
		{"no group 1", "+1\n+0\n+-5\n+14\n", []int{14}, `"+1"`, nil},
		{"too big", "+4194305\n+14\n", []int{14}, `"+4194305"`, nil},
		{"garbage", "x\n\n+\n12\n+14\n", []int{14}, `"x"`, nil},
		{"long", "+" + strings.Repeat("9", 10000) + "\n+14\n", []int{14}, "too long", nil},
		{"no newline", "+14\n+15", []int{14}, "no newline", nil},
		{"dirs", "D/dev/shm/a\nD/tmp/b\n+14\nU/tmp/b\n", []int{14}, "", []string{"/dev/shm/a"}},
		{"dir counted", "D/tmp/b\nD/tmp/b\nU/tmp/b\n", nil, "", []string{"/tmp/b"}},
		{"dir unknown", "U/tmp/b\nD/tmp/c\n", nil, `"U/tmp/b" (not registered)`, []string{"/tmp/c"}},
		{"bad dirs", "D/\nDrel\nD/tmp/../etc\nD/tmp/x/\nD\nD/tmp/ok\n", nil, `"D/"`, []string{"/tmp/ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var killed []int
			var removed []string
			err := Serve(strings.NewReader(tc.in), func(p int) { killed = append(killed, p) }, func(d string) { removed = append(removed, d) },
				func(tag string) { t.Errorf("swept tag %s", tag) })
			slices.Sort(killed)
			slices.Sort(removed)
			if !slices.Equal(killed, tc.kill) {
				t.Errorf("killed %v, want %v", killed, tc.kill)
			}
			if !slices.Equal(removed, tc.rm) {
				t.Errorf("removed %v, want %v", removed, tc.rm)
			}
			switch {
			case tc.bad == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Errorf("error %v, want one with %q", err, tc.bad)
			}
		})
	}
}

// Tags of nodes still forking at end-of-file are swept, after the
// groups' kills; a fork phase that ended is not, whatever its ranks
// left.
func TestServeTags(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		swept    []string
		bad      string
	}{
		{"forking", "Fab12\n+14\n", []string{"ab12"}, ""},
		{"forked", "Fab12\n+14\nfab12\n", nil, ""},
		{"counted", "Fab12\nFab12\nfab12\nFcd\n", []string{"ab12", "cd"}, ""},
		{"end unknown", "fab12\nFcd\n", []string{"cd"}, `"fab12" (not registered)`},
		{"bad tags", "F\nFAB\nFa-b\nF" + strings.Repeat("a", 65) + "\nFab0\n", []string{"ab0"}, `"F"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var order, swept []string
			err := Serve(strings.NewReader(tc.in), func(p int) { order = append(order, "kill") }, func(string) {},
				func(tag string) { swept = append(swept, tag); order = append(order, "sweep") })
			slices.Sort(swept)
			if !slices.Equal(swept, tc.swept) {
				t.Errorf("swept %v, want %v", swept, tc.swept)
			}
			if i := slices.Index(order, "kill"); i > 0 {
				t.Errorf("a sweep before the kills: %v", order)
			}
			switch {
			case tc.bad == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Errorf("error %v, want one with %q", err, tc.bad)
			}
		})
	}
}

// A read error ends the guard as end-of-file does: it kills.
func TestServeReadError(t *testing.T) {
	var killed []int
	err := Serve(io.MultiReader(strings.NewReader("+12\n"), errReader{}), func(p int) { killed = append(killed, p) }, func(string) {}, func(string) {})
	if err == nil || !slices.Equal(killed, []int{12}) {
		t.Errorf("killed %v, error %v: want [12] and the read error", killed, err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrClosedPipe }

// Started by hand (no pipe on stdin), the guard mode refuses with one
// line.
func TestMainByHand(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/proc/self/exe", Arg)
	cmd.Stdin = f
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "is internal") {
		t.Errorf("guard mode by hand: %v, %q; want exit code 2 and a line saying it is internal", err, out)
	}
}
