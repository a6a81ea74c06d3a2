// Package guard makes sure that nothing a rank started outlives the
// process that forked the ranks — pmirun with the fork bootstrap, a pmid
// agent, pmid --daemon — even when that process is killed with SIGKILL
// and runs no code of its own.
//
// The model: ranks are forked in process groups of their own
// (sys.RankProcAttr), so a rank and everything it starts that stays in
// its group (shells, wrapper scripts, background jobs, their children)
// share one process group id, the rank's pid. The parent-death signal
// kills the rank when its forker dies, but not the rest of its group. So
// the forking process re-executes its own binary as a small guard
// process (Main, which the command's main calls before anything else)
// and keeps the write end of a pipe to the guard's standard input. Right
// after it forks a rank it writes "+PGID"; once the group is known to be
// empty, or the rank's job is over, it writes "-PGID". The guard only
// reads. When the forking process ends, however it ends, the kernel
// closes the write end and the guard reads end-of-file: it sends SIGKILL
// to every group still registered and exits at once. Pipe end-of-file is
// robust where the parent-death signal is not (Go delivers that one when
// the forking thread exits, not the process). A process that ends
// normally has unregistered every group by then, so the guard kills
// nothing; a process that ends with ranks still registered (killed, or
// an error path) takes their groups with it, as the parent-death signal
// takes the ranks.
//
// Registrations are counted, not a set: a group id the kernel reused for
// a new rank while an old registration of it is still open (its job not
// yet over) is killed until both are removed.
//
// Forks under way. A rank's group is registered once its fork has
// returned, and a forker that is busy (its threads waiting for a CPU
// that thousands of starting ranks share) may take milliseconds to get
// there, while the rank already runs and starts processes. So a forker
// tags its ranks' environments (TagVar=TAG, one tag for a node's ranks)
// and writes "FTAG" before it forks the first of them and "fTAG" once
// every one it forked is registered. A tag still open at end-of-file
// makes the guard, after its kills, kill every process of the user
// whose environment holds the tag (a guard's excepted: a nested
// launcher's guard must outlive its forker to act).
//
// Directories. A job's files outside the ranks' own (a node's directory
// for Open MPI's shared-memory files, which every rank writes into) are
// removed by the forking process at the job's end, which a SIGKILL skips.
// So it registers such a directory with the guard once it made it
// ("D/path"), and unregisters it once it removed it ("U/path"); the
// guard removes, after its kills, every directory still registered.
//
// The guard runs in a process group of its own and ignores SIGINT,
// SIGTERM, SIGHUP and SIGQUIT: a terminal's Ctrl-C, or a kill of the
// launcher's process group, must not end it before the launcher has
// acted. It never outlives its forker by more than the kill: end-of-file
// is its only way out (or SIGKILL).
//
// What is covered: every process that stays in a rank's process group,
// and, while its node forks, every process that keeps the rank's tag in
// its environment. What is not: a process that leaves its rank's group
// (setsid or setpgid: daemons, shells with job control such as bash -i,
// a nested launcher's own ranks — though a nested pmirun is itself in
// the group, and its own guard then kills its ranks' groups) once its
// node is forked, or drops the tag before. Neither a child subreaper
// (PR_SET_CHILD_SUBREAPER) nor anything short of a cgroup the launcher
// owns can find those once their forker is dead: orphans of a dead
// subreaper go to init.
//
// Ownership and lifetimes: one guard per process, started by the
// command's main (Start) and stopped just before it exits (Stop); it
// serves every node and job the process runs (every job of a daemon).
// Library code and tests never start one, so a test binary is never
// re-executed and Add and Remove do nothing. The Guard owns the guard
// process and one goroutine that starts it (Stop waits for that one).
// Nothing waits for the guard to exit: Stop closes the pipe and returns,
// and the guard, reading end-of-file, exits by itself (reaped by init
// once its parent has exited). Waiting would add the guard's own
// start-up, a Go program's (about 20 ms on the project's test machines),
// to the end of every job shorter than that. A guard that dies early is
// found by the next write (EPIPE), killed if need be and reaped then.
package guard

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Arg is the hidden command-line argument that makes a fastpmi command
// its own parent's guard: "pmirun --fastpmi-internal-guard", with the
// pipe on standard input.
const Arg = "--fastpmi-internal-guard"

// SelfExe is what the commands' main passes to Start: the running
// binary itself, as the kernel knows it (the guard speaks the protocol of
// the binary that started it even when the file was replaced since).
const SelfExe = "/proc/self/exe"

// guardNice is the guard's nice value once it is exec'd: the lowest
// priority. It must exist from the start (its process holds the pipe's
// read end from the fork on), but its own start-up — a Go program's,
// about 15 ms of CPU on the project's 2-core test machines — may wait
// for idle CPU rather than take it from the job's start-up; its one task
// at the end, a few kill calls, needs little. (Not from the fork on: the
// child's steps before exec run while the parent holds Go's fork lock,
// which every rank's fork waits for.) Once a job's ranks are forked
// (StartupOver) its start-up competes with nothing the launcher waits
// for, and a guard still starting at the lowest priority on a busy
// machine may take seconds to act: its main thread, where Main serves,
// goes back to normal priority where the process may raise it (root).
const guardNice = 19

// writeTimeout bounds a registration's write when the guard has stopped
// reading (its pipe holds thousands of records, so a live guard never
// makes it wait).
const writeTimeout = 2 * time.Second

// Guard is the forking process's end of its guard: the pipe's write end
// and the guard process.
type Guard struct {
	exe string
	log *slog.Logger
	// started is closed when the goroutine starting the guard process
	// has returned (proc is set, or broken).
	started chan struct{}

	mu sync.Mutex // guards the fields below; held across each write
	// w is the write end of the pipe to the guard; nil after Stop. It is
	// never closed while the guard may still act on it unless the
	// process is over (Stop): closing it is what makes the guard kill.
	w *os.File
	// proc is the guard process once started; nil before, or if it did
	// not start.
	proc *os.Process
	// broken is set when the guard cannot guard (it did not start, died,
	// or stopped reading): nothing more is written, the guard process is
	// killed and reaped if it runs, and the warning was logged once.
	broken bool
	// startupOver is set by StartupOver: the guard runs at normal
	// priority from then on.
	startupOver bool
}

// current is the process's guard (Start), or nil. Stored once by Start
// (from main, before any rank is forked) and loaded by Add, Remove and
// Stop; the pointer's store publishes the Guard's construction.
var current atomic.Pointer[Guard]

// Start starts this process's guard, the binary exe re-executed with Arg,
// and makes it the one Add and Remove use. It returns at once: the guard
// process starts on a goroutine of its own, off the job's critical path,
// and registrations made before it runs wait in the pipe. If it cannot
// start, jobs still run: log says so once (at Info level), and survivors
// of a killed process are then not guarded. Start is for a command's
// main; a second call does nothing.
func Start(exe string, log *slog.Logger) {
	g, err := New(exe, log)
	if err != nil {
		g.log.Info("processes the ranks start are not guarded: they may survive if this process is killed", "err", err)
		return
	}
	if !current.CompareAndSwap(nil, g) {
		g.Stop()
	}
}

// Add registers process group pgid with this process's guard (Start),
// right after the fork of the rank that leads it. It reports whether the
// group is registered (false: no guard, or it is broken), and then the
// caller owes exactly one Remove of it.
func Add(pgid int) bool { return current.Load().Add(pgid) }

// Remove ends one registration of pgid with this process's guard.
func Remove(pgid int) { current.Load().Remove(pgid) }

// AddDir registers directory dir (an absolute, clean path) with this
// process's guard: it is removed, with everything in it, if the process
// ends before RemoveDir. It reports whether the guard has it.
func AddDir(dir string) bool { return current.Load().AddDir(dir) }

// RemoveDir ends the registration of dir, once the caller removed it.
func RemoveDir(dir string) { current.Load().RemoveDir(dir) }

// TagVar is the variable of a rank's environment that holds its node's
// tag (Forking).
const TagVar = "FASTPMI_GUARD_TAG"

// NewTag returns a new tag for a node's ranks, random hex.
func NewTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Forking tells this process's guard that ranks whose environment holds
// TagVar=tag are about to be forked: if the process ends before Forked,
// the guard kills every process that holds it. It reports whether the
// guard has it; then the caller owes one Forked.
func Forking(tag string) bool { return current.Load().Forking(tag) }

// Forked ends Forking(tag): every rank forked with tag is registered
// (Add) or did not start.
func Forked(tag string) { current.Load().Forked(tag) }

// Stop stops this process's guard: it kills the groups still registered
// and exits. Call it just before the process exits; Add and Remove do
// nothing after.
func Stop() { current.Load().Stop() }

// StartupOver tells this process's guard that a job's ranks have been
// forked: the guard's main thread goes back to normal priority (see
// guardNice), best effort. Cheap after the first call.
func StartupOver() { current.Load().StartupOver() }

// StartupOver is the package-level StartupOver. Safe on a nil Guard.
func (g *Guard) StartupOver() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.startupOver {
		return
	}
	g.startupOver = true
	if g.proc != nil {
		// Every thread: the runtime's, made at nice 19 during its
		// start-up, may be what the main thread waits for. Raising a
		// priority needs the privilege; without it they stay.
		_ = sys.ReniceProcess(g.proc.Pid, 0)
	}
}

// New starts a guard: exe re-executed with Arg, on a goroutine of its
// own. Start is New for the process's one guard; tests use New directly.
// The error is the pipe's, the only part made before New returns; the
// Guard returned with it is closed but its logger usable.
func New(exe string, log *slog.Logger) (*Guard, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Guard{exe: exe, log: log, started: make(chan struct{})}
	r, w, err := os.Pipe() // both close-on-exec: no rank inherits them
	if err != nil {
		close(g.started)
		return g, fmt.Errorf("start guard: %w", err)
	}
	g.w = w
	go g.run(r)
	return g, nil
}

// run starts the guard process with r as its standard input. It owns r.
func (g *Guard) run(r *os.File) {
	defer close(g.started)
	cmd := &exec.Cmd{
		Path:        g.exe,
		Args:        []string{os.Args[0], Arg},
		Stdin:       r,
		SysProcAttr: sys.GuardProcAttr(),
		// Stdout and stderr /dev/null: a guard holding the launcher's
		// output open would keep its readers waiting, and one writing
		// to a terminal from the background could be stopped.
	}
	err := cmd.Start()
	r.Close() // the guard has its copy; without one, writes fail at once
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil && !g.startupOver {
		// Its Go start-up runs now, on its main thread: let it wait for
		// idle CPU (best effort; threads it already made keep their
		// priority, and do little).
		_ = sys.Renice(cmd.Process.Pid, guardNice)
	}
	if err != nil {
		g.failLocked(fmt.Errorf("start guard %s: %w", g.exe, err))
		return
	}
	g.proc = cmd.Process
	if g.broken {
		// A write failed before it ran: it must not act on a
		// registration it lacks.
		g.killLocked()
	}
}

// failLocked marks the guard broken, kills and reaps its process if it
// runs, and logs why once.
func (g *Guard) failLocked(err error) {
	if g.broken {
		return
	}
	g.broken = true
	g.killLocked()
	g.log.Info("processes the ranks start are not guarded: they may survive if this process is killed", "err", err)
}

// killLocked kills and reaps the guard process, if it was started.
func (g *Guard) killLocked() {
	if g.proc != nil {
		_ = g.proc.Kill()
		_, _ = g.proc.Wait() // at once: it is dead or dying
		g.proc = nil
	}
}

// Add registers process group pgid; see the package-level Add. Safe on a
// nil Guard (it does nothing).
func (g *Guard) Add(pgid int) bool { return pgid >= 2 && g.send('+', strconv.Itoa(pgid)) }

// Remove ends one registration of pgid (one Add's). Safe on a nil Guard.
func (g *Guard) Remove(pgid int) {
	if pgid >= 2 {
		g.send('-', strconv.Itoa(pgid))
	}
}

// AddDir registers dir; see the package-level AddDir. Safe on a nil
// Guard.
func (g *Guard) AddDir(dir string) bool {
	return validDir(dir) && g.send('D', dir)
}

// RemoveDir ends dir's registration (AddDir's). Safe on a nil Guard.
func (g *Guard) RemoveDir(dir string) {
	if validDir(dir) {
		g.send('U', dir)
	}
}

// Forking is the package-level Forking. Safe on a nil Guard.
func (g *Guard) Forking(tag string) bool { return validTag(tag) && g.send('F', tag) }

// Forked ends one Forking of tag. Safe on a nil Guard.
func (g *Guard) Forked(tag string) {
	if validTag(tag) {
		g.send('f', tag)
	}
}

// validTag reports whether tag can be a node's tag: 1 to 64 lower-case
// hex digits.
func validTag(tag string) bool {
	if len(tag) == 0 || len(tag) > 64 {
		return false
	}
	for _, c := range []byte(tag) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// maxDir bounds a registered directory's path: a record is written
// whole in one write of at most PIPE_BUF bytes, and read whole into the
// guard's buffer.
const maxDir = 1024

// validDir reports whether dir can be registered: absolute, clean, not
// the root, one line, at most maxDir bytes.
func validDir(dir string) bool {
	return len(dir) <= maxDir && filepath.IsAbs(dir) && filepath.Clean(dir) == dir && dir != "/" &&
		!strings.ContainsAny(dir, "\n\x00")
}

// send writes one record, op and arg; it reports whether the guard has
// it.
func (g *Guard) send(op byte, arg string) bool {
	if g == nil {
		return false
	}
	b := make([]byte, 0, len(arg)+2)
	b = append(b, op)
	b = append(b, arg...)
	b = append(b, '\n')
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil || g.broken {
		return false
	}
	// One write of fewer than PIPE_BUF bytes: the kernel writes it
	// whole or not at all, so the guard never reads half a record.
	_ = g.w.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := g.w.Write(b); err != nil {
		g.failLocked(fmt.Errorf("write to guard: %w", err))
		return false
	}
	return true
}

// Stop closes the pipe — the guard kills the groups still registered and
// exits by itself — once the guard process has been started (or failed
// to start); it does not wait for the guard to exit (see the package
// comment). Idempotent; safe on a nil Guard.
func (g *Guard) Stop() {
	if g == nil {
		return
	}
	<-g.started // so that the start is not cut off by the process's exit
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		g.w.Close()
		g.w = nil
	}
}

// Main makes this process a guard when its command line is exactly
// Arg: it serves the guard on standard input and exits the process. It
// returns at once otherwise. Commands call it first thing in main.
func Main() {
	if len(os.Args) != 2 || os.Args[1] != Arg {
		return
	}
	name := filepath.Base(os.Args[0])
	if fi, err := os.Stdin.Stat(); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		fmt.Fprintf(os.Stderr, "%s: %s is internal: the process a fastpmi command starts to guard its ranks, with a pipe on standard input\n", name, Arg)
		os.Exit(2)
	}
	signal.Ignore(sys.SIGINT, sys.SIGTERM, sys.SIGHUP, sys.SIGQUIT)
	// Serve on the main thread, whose priority the forker restores once
	// the job started (StartupOver), in blocking reads: the pipe came
	// non-blocking from the forker's Go, and a read through Go's poller
	// would wait for one of the runtime's other threads, made at the
	// lowest priority, to see the end-of-file.
	runtime.LockOSThread()
	in := os.Stdin
	if err := sys.SetBlocking(0); err == nil {
		in = os.NewFile(0, "/dev/stdin")
	}
	// Started as /proc/self/exe, it would show as "exe" in ps: name it
	// after its command's binary (pmirun-guard, pmid-guard).
	if exe, err := os.Executable(); err == nil {
		_ = sys.SetProcessName(filepath.Base(exe) + "-guard")
	}
	if err := Serve(&pacedReader{r: in, pause: readPause}, killGroup, removeDir, killTagged); err != nil {
		// Every group still registered was killed; the error is the
		// forker's bug, and its stderr is /dev/null: exit non-zero.
		os.Exit(1)
	}
	os.Exit(0)
}

// readPause is how long the guard waits after a read that returned
// records before it reads again. A writer wakes a reader only when one
// waits in read: while records stream in (a node forking or reaping
// thousands of ranks), the guard then wakes once per pause instead of
// once per record — each wake-up a context switch or several on the
// forker's machine, while the job starts. It delays the kill after its
// forker's death by at most this much.
const readPause = 20 * time.Millisecond

// pacedReader reads r, sleeping pause before a read that follows one
// that returned data. Idle, the guard blocks in read and wakes at the
// first record (or end-of-file) at once.
type pacedReader struct {
	r     io.Reader
	pause time.Duration
	got   bool // the last read returned data
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.got {
		time.Sleep(p.pause)
	}
	n, err := p.r.Read(b)
	p.got = n > 0
	return n, err
}

// register counts one registration of k in open (add), or ends one; it
// reports false for the end of a registration that is not open.
func register[K comparable](open map[K]int, k K, add bool) bool {
	switch {
	case add:
		open[k]++
	case open[k] == 0:
		return false
	case open[k] == 1:
		delete(open, k)
	default:
		open[k]--
	}
	return true
}

// killGroup is the guard's kill: SIGKILL to the whole group.
func killGroup(pgid int) { _ = sys.SignalGroup(pgid, sys.SIGKILL) }

// removeDir is the guard's removal of a registered directory.
func removeDir(dir string) { _ = os.RemoveAll(dir) }

// killTagged is the guard's kill of a tag still open: SIGKILL to every
// process whose environment holds TagVar=tag, but guards. It reads
// /proc: processes of other users cannot be read, nor killed.
func killTagged(tag string) {
	entry := TagVar + "=" + tag
	for _, pid := range sys.Pids() {
		if pid == os.Getpid() || !sys.HasEnv(pid, entry) {
			continue
		}
		if cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && bytes.HasSuffix(cmd, []byte("\x00"+Arg+"\x00")) {
			continue // a nested launcher's guard: it acts for its own ranks
		}
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
			_ = p.Release()
		}
	}
}

// maxPgid bounds a group id the guard accepts (the kernel's PID_MAX_LIMIT
// is 2^22).
const maxPgid = 1 << 22

// Serve is the guard: it reads records from r until end-of-file (or a
// read error), then calls kill once for every group still registered,
// sweep once for every tag still forking, then remove once for every
// directory still registered. A malformed record (not "+N" or "-N" with
// 2 <= N <= 2^22, "D/path" or "U/path" with a path AddDir takes, "FTAG"
// or "fTAG" with a tag Forking takes, or an end without its start) is
// skipped and reported in the error, after the kills and removals: the
// guard never stops guarding because its forker misspoke.
func Serve(r io.Reader, kill func(pgid int), remove func(dir string), sweep func(tag string)) error {
	groups := map[int]int{}  // registrations open per group
	dirs := map[string]int{} // registrations open per directory
	tags := map[string]int{} // fork phases open per tag
	var bad []string
	br := bufio.NewReaderSize(r, 4096)
	var rerr error
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			bad = append(bad, fmt.Sprintf("%.16q... (too long)", line))
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n') // skip the rest of it
			}
			line = nil
		}
		if err != nil {
			if len(line) > 0 {
				bad = append(bad, strconv.Quote(string(line))+" (no newline)")
			}
			if !errors.Is(err, io.EOF) {
				rerr = err
			}
			break
		}
		if line == nil {
			continue
		}
		line = line[:len(line)-1]
		well, open := false, true
		if len(line) > 0 && (line[0] == 'D' || line[0] == 'U') {
			dir := string(line[1:])
			if well = validDir(dir); well {
				open = register(dirs, dir, line[0] == 'D')
			}
		} else if len(line) > 0 && (line[0] == 'F' || line[0] == 'f') {
			tag := string(line[1:])
			if well = validTag(tag); well {
				open = register(tags, tag, line[0] == 'F')
			}
		} else {
			pgid, perr := strconv.Atoi(string(line[min(1, len(line)):]))
			if well = len(line) >= 2 && (line[0] == '+' || line[0] == '-') && perr == nil && pgid >= 2 && pgid <= maxPgid; well {
				open = register(groups, pgid, line[0] == '+')
			}
		}
		switch {
		case !well:
			bad = append(bad, strconv.Quote(string(line)))
		case !open:
			bad = append(bad, strconv.Quote(string(line))+" (not registered)")
		}
	}
	for pgid := range groups {
		kill(pgid)
	}
	for tag := range tags {
		sweep(tag)
	}
	for dir := range dirs {
		remove(dir)
	}
	if len(bad) > 0 {
		rerr = errors.Join(rerr, fmt.Errorf("guard: malformed records %v", bad))
	}
	return rerr
}
