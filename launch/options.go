package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpmi/fastpmi/agent"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/jobreport"
)

// Values the options may take (the command line's completion offers the
// same lists).
var (
	BindUnits   = []string{"core", "hwthread", "socket", "none"}
	MapUnits    = []string{"core", "hwthread", "socket"}
	Codecs      = []string{"auto", "s2", "zstd", "none"}
	NetBackends = []string{"auto", "uring", "net"}
)

// MinNetTimeout is the shortest --net-timeout: agents send heartbeats
// every node.Heartbeat, so a shorter one would declare live links dead.
const MinNetTimeout = 4 * node.Heartbeat

// StdinNone and StdinAll are Config.StdinRank's two non-rank values.
const (
	StdinNone = -1
	StdinAll  = -2
)

// unsaidSize is the number of ranks of a job whose -n is not given, as
// Hydra counts it: a rank for every slot of the job's nodes, each host's
// HOST:SLOTS (1 when unsaid), or PPN on every node; this machine alone
// is one node. Under Slurm, as srun does, it is the allocation's
// SLURM_NTASKS when no PPN is given.
func (c *Config) unsaidSize() int {
	perNode := func(slots int) int {
		if c.PPN > 0 {
			return c.PPN
		}
		return max(slots, 1)
	}
	switch {
	case len(c.Hosts) > 0:
		n := 0
		for i := range c.Hosts {
			s := 0
			if i < len(c.Slots) {
				s = c.Slots[i]
			}
			n += perNode(s)
		}
		return n
	case len(c.Daemons) > 0:
		return len(c.Daemons) * perNode(0)
	case c.Bootstrap == "loopback":
		return max(c.Nodes, 1) * perNode(0)
	case c.Bootstrap == "slurm":
		if n, err := strconv.Atoi(os.Getenv("SLURM_NTASKS")); err == nil && n > 0 && c.PPN == 0 {
			return n
		}
		if hosts, err := c.hostList(); err == nil {
			return len(hosts) * perNode(0)
		}
	}
	return perNode(0)
}

// validatePlacement makes the bootstrap follow from the hosts (ssh, as
// Hydra does, when hosts are given and no bootstrap) and refuses every
// placement option the job would otherwise ignore.
func (c *Config) validatePlacement() error {
	if len(c.Slots) != 0 && len(c.Slots) != len(c.Hosts) {
		return fmt.Errorf("%d slot counts for %d hosts", len(c.Slots), len(c.Hosts))
	}
	c.mergeRepeatedHosts()
	if len(c.Hosts) > 0 && c.Bootstrap == "" && len(c.Daemons) == 0 && onlyThisMachine(c.Hosts) {
		// Every host is this machine (-hosts localhost, a hostfile of
		// $(hostname):4): one node, forked here, without ssh to itself,
		// as Hydra runs its local host.
		c.Hosts, c.Slots = nil, nil
	}
	if len(c.Hosts) > 0 {
		switch c.Bootstrap {
		case "":
			if len(c.Daemons) == 0 {
				c.Bootstrap = "ssh"
			}
		case "ssh", "netns":
		default:
			return fmt.Errorf("hosts (-hosts, -hostfile) are for --bootstrap ssh or netns, not %s", c.Bootstrap)
		}
		if len(c.Daemons) > 0 {
			return errors.New("--daemons names the nodes itself: it excludes -hosts and -hostfile")
		}
	}
	if c.Nodes != 0 && c.Bootstrap != "loopback" {
		return errors.New("--nodes is the number of agents of --bootstrap loopback; for other nodes give -hosts")
	}
	if !c.multiNode() && len(c.Daemons) == 0 {
		if c.Cyclic {
			return errors.New("--cyclic places ranks over several nodes: give -hosts (or --bootstrap)")
		}
		if c.PPN != 0 && c.PPN < c.Size {
			return fmt.Errorf("-ppn %d places %d ranks on more than one node: give -hosts (or --bootstrap)", c.PPN, c.Size)
		}
	}
	if c.StdinRank >= c.Size {
		return fmt.Errorf("invalid -i/--stdin %d: the job has ranks 0..%d", c.StdinRank, c.Size-1)
	}
	if c.StdinRank < StdinAll {
		return fmt.Errorf("invalid -i/--stdin %d", c.StdinRank)
	}
	if c.StdinRank == StdinAll && (c.multiNode() || len(c.Daemons) > 0) {
		return errors.New("--stdin all needs a job on one node; give a rank for a multi-node job")
	}
	switch {
	case c.Bind == "" || c.Bind == "none":
		c.Bind = ""
		if c.MapBy != "" {
			return fmt.Errorf("-map-by %s orders the ranks' CPU binding: it needs -bind-to", c.MapBy)
		}
	case !slices.Contains(BindUnits, c.Bind):
		return fmt.Errorf("invalid -bind-to %q: want %s", c.Bind, strings.Join(BindUnits, ", "))
	}
	if c.MapBy != "" && !slices.Contains(MapUnits, c.MapBy) {
		return fmt.Errorf("invalid -map-by %q: want %s", c.MapBy, strings.Join(MapUnits, ", "))
	}
	if strings.Contains(c.PmidPath, "/") && !filepath.IsAbs(c.PmidPath) {
		// A path relative to pmirun's directory, as the program's: ssh
		// runs the agent's command in the login's home.
		abs, err := filepath.Abs(c.PmidPath)
		if err != nil {
			return fmt.Errorf("--pmid %s: %w", c.PmidPath, err)
		}
		c.PmidPath = abs
	}
	if c.Wdir != "" {
		if !filepath.IsAbs(c.Wdir) {
			wd, err := os.Getwd()
			if err != nil {
				return fmt.Errorf("working directory: %w", err)
			}
			c.Wdir = filepath.Join(wd, c.Wdir)
		}
	}
	// On this machine the directories must be there; other nodes report
	// their own.
	if c.Bootstrap == "ssh" || c.Bootstrap == "slurm" || len(c.Daemons) > 0 {
		return nil
	}
	if err := checkDir(c.Wdir); err != nil {
		return fmt.Errorf("invalid -wdir %s: %w", c.Wdir, err)
	}
	for i, a := range c.Apps {
		if a.Wdir == "" {
			continue
		}
		dir := a.Wdir
		if !filepath.IsAbs(dir) && c.Wdir != "" {
			dir = filepath.Join(c.Wdir, dir)
		}
		if err := checkDir(dir); err != nil {
			return fmt.Errorf("MPMD command %d (%s): invalid -wdir %s: %w", i, a.Prog, a.Wdir, err)
		}
	}
	return nil
}

// mergeRepeatedHosts makes a host named several times in a row (-hosts
// a,a,b, or a machinefile with a line per core such as PBS's
// $PBS_NODEFILE) one node holding the slots of all of them (1 for each
// without HOST:SLOTS), as Hydra does: the ranks of a host share its agent
// and shared segment, and MPI sees them on one node.
func (c *Config) mergeRepeatedHosts() {
	slots := c.Slots
	if slots == nil {
		slots = make([]int, len(c.Hosts))
	}
	var hosts []string
	var merged []int
	repeated := false
	for i, h := range c.Hosts {
		if i > 0 && h == c.Hosts[i-1] {
			last := len(merged) - 1
			merged[last] = max(merged[last], 1) + max(slots[i], 1)
			repeated = true
			continue
		}
		hosts = append(hosts, h)
		merged = append(merged, slots[i])
	}
	if repeated {
		c.Hosts, c.Slots = hosts, merged
	}
}

// checkDir says why dir cannot be a working directory; "" is the
// current one.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such directory")
	case err != nil:
		return err
	case !st.IsDir():
		return errors.New("not a directory")
	}
	return nil
}

// validateLinks checks the multi-node options whatever the bootstrap.
func (c *Config) validateLinks() error {
	if err := c.checkSSH(); err != nil {
		return err
	}
	if c.TreeWidth < 0 {
		return fmt.Errorf("invalid tree width %d", c.TreeWidth)
	}
	if c.Codec != "" && !slices.Contains(Codecs, c.Codec) {
		return fmt.Errorf("invalid --compress %q: want %s", c.Codec, strings.Join(Codecs, ", "))
	}
	if c.NetBackend != "" && !slices.Contains(NetBackends, c.NetBackend) {
		return fmt.Errorf("invalid --netio %q: want %s", c.NetBackend, strings.Join(NetBackends, ", "))
	}
	if _, err := agent.ParseKVSPolicy(c.KVS); err != nil {
		return fmt.Errorf("invalid --kvs: %w", err)
	}
	if _, err := node.ParseStrategy(c.GetStrategy); err != nil {
		return fmt.Errorf("invalid --get-strategy: %w", err)
	}
	if c.NetTimeout != 0 && c.NetTimeout < MinNetTimeout {
		return fmt.Errorf("invalid --net-timeout %v: want at least %v (agents send a heartbeat every %v)", c.NetTimeout, MinNetTimeout, node.Heartbeat)
	}
	return nil
}

// reportPathError is validation's refusal of the --report path itself:
// Run then writes no report there, so the refusal stays the one line a
// bad option gets.
type reportPathError struct{ error }

func (e reportPathError) Unwrap() error { return e.error }

// validateOutput checks the output options and turns them into the
// nodes' line prefix.
func (c *Config) validateOutput() error {
	// pmirun writes these when the job ends: refused now, not after a
	// job of hours (and never one file for both).
	if c.TracePath != "" && c.ReportPath != "" && sameFile(c.TracePath, c.ReportPath) {
		return fmt.Errorf("--trace and --report name the same file, %s", c.TracePath)
	}
	for _, f := range []struct{ flag, path string }{{"--trace", c.TracePath}, {"--report", c.ReportPath}} {
		if f.path == "" {
			continue
		}
		if err := jobreport.CheckWritable(f.path); err != nil {
			err = fmt.Errorf("invalid %s %s: %w", f.flag, f.path, err)
			if f.flag == "--report" {
				return reportPathError{err}
			}
			return err
		}
	}
	if c.PrefixPattern != "" {
		if c.Label || c.TagOutput || c.Timestamp {
			return errors.New("-prepend-pattern excludes -l, --tag-output and --timestamp-output (put %r, %h, %t in the pattern)")
		}
		if err := node.CheckPattern(c.PrefixPattern, "rht"); err != nil {
			return fmt.Errorf("invalid -prepend-pattern: %w", err)
		}
	}
	for _, p := range []struct{ flag, pat string }{{"-outfile-pattern", c.OutPattern}, {"-errfile-pattern", c.ErrPattern}} {
		if p.pat == "" {
			continue
		}
		if err := node.CheckPattern(p.pat, "rh"); err != nil {
			return fmt.Errorf("invalid %s: %w", p.flag, err)
		}
		if c.Size > 1 && !strings.Contains(p.pat, "%r") {
			return fmt.Errorf("invalid %s %q: with more than one rank it needs %%r (every rank would write the same file)", p.flag, p.pat)
		}
	}
	return nil
}

// sameFile reports whether paths a and b name one file: the same path,
// or a regular file there already that both reach (a link to the other,
// a hard link), which would hold the trace or the report, not both.
func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && sa.Mode().IsRegular() && os.SameFile(sa, sb)
}

// prefix is the nodes' line prefix pattern.
func (c *Config) prefix() string {
	if c.PrefixPattern != "" {
		return c.PrefixPattern
	}
	p := ""
	if c.Timestamp {
		p = "%t "
	}
	switch {
	case c.TagOutput:
		p += "[%r@%h] "
	case c.Label:
		p += "[%r] "
	}
	return p
}

// launcherThreads is how many more threads pmirun may create while it
// starts a job (the reserve a node makes before it forks), and agentTasks
// what a loopback agent (pmid) takes: its process and threads. Both are
// generous: a cgroup that is this close to its limit would fail the job
// mid-start instead. launcherTasks is what pmirun takes of the user's
// RLIMIT_NPROC, which counts threads, where no pids cgroup makes it hold
// its thread reserve up front: the threads its runtime makes as it forks,
// the ranks forked at once (each a task before its exec) and its guard's
// (internal/guard) threads; measured up to 29 here. A limit closer than
// that fails the job mid-start, or aborts pmirun where the Go runtime
// cannot make a thread it needs ("fatal error: newosproc").
const (
	launcherThreads = node.ThreadReserve
	agentTasks      = node.ThreadReserve + 8
	launcherTasks   = 32
)

// validateLimits refuses a job this machine's limits cannot start, at
// once and saying which limit: more ranks here than the user may run
// processes, or a shared segment larger than the memory available.
func (c *Config) validateLimits() error {
	if c.Virtual != "" {
		return nil // goroutine ranks
	}
	local := !c.multiNode() && len(c.Daemons) == 0 // ranks forked by pmirun itself
	if !local && c.Bootstrap != "loopback" {
		return nil // other machines check their own
	}
	if local && !c.NoShm {
		need, err := node.SegmentBytes(c.Size, c.Size)
		if err != nil {
			return fmt.Errorf("-n %d: no shared segment for so many ranks (%v); use --no-shm", c.Size, err)
		}
		if avail, err := sys.MemAvailable(); err == nil && need > avail {
			return fmt.Errorf("-n %d: the shared segment needs %d MiB, more than the %d MiB of memory available (MemAvailable); use fewer ranks or --no-shm",
				c.Size, need>>20, avail>>20)
		}
		if r, ok := sys.MemoryRoom(); ok && need > r.Left {
			return fmt.Errorf("-n %d: the shared segment needs %d MiB, more than the %d MiB the memory cgroup leaves (%s: %d MiB, %d MiB in use); use fewer ranks or --no-shm",
				c.Size, need>>20, r.Left>>20, r.File, r.Limit>>20, r.Used>>20)
		}
		// The segment is a file (a memfd) to the kernel, which sizes it
		// only within the file size limit.
		if lim, err := sys.FileSizeLimit(); err == nil && lim > 0 && need > lim {
			return fmt.Errorf("-n %d: the shared segment needs %d KiB, more than the file size limit allows (RLIMIT_FSIZE %d KiB; see ulimit -f); use --no-shm",
				c.Size, (need+1023)>>10, lim>>10)
		}
	}
	// A pids cgroup (a container's or a batch job's) counts every process
	// and thread under it, pmirun's and the agents' own threads too.
	var agents uint64
	if !local {
		agents = uint64(c.Nodes) * agentTasks
	}
	if r, ok := sys.TaskRoom(); ok {
		if need := uint64(c.Size) + launcherThreads + agents; need > r.Left {
			return fmt.Errorf("-n %d: more ranks than the pids cgroup leaves room for (%d tasks needed with pmirun's own threads, %d left: %s is %d, %d in use)",
				c.Size, need, r.Left, r.File, r.Limit, r.Used)
		}
	}
	// Every rank runs on this machine: the user's process limit counts
	// them all, and every thread of the user's processes, pmirun's own
	// and the agents' too.
	if lim, err := sys.ProcessLimit(); err == nil && lim > 0 {
		if need := uint64(c.Size) + launcherTasks + agents; need > lim {
			return fmt.Errorf("-n %d: more ranks than this user may run processes (%d tasks needed with pmirun's own threads, RLIMIT_NPROC %d; see ulimit -u)", c.Size, need, lim)
		}
	}
	lim, err := sys.FileLimit()
	if err != nil || lim == 0 {
		return nil
	}
	if !local {
		// Each loopback agent holds its own segment, and the descriptors
		// of its own ranks under the limit pmirun has (a pmid raises its
		// soft limit to the hard one, as pmirun does).
		if c.Nodes < 1 {
			return nil // said by the bootstrap
		}
		nodes, err := placeRanks(*c, c.Nodes)
		if err != nil {
			return nil // said by the placement
		}
		most := 0
		for _, rs := range nodes {
			most = max(most, len(rs))
		}
		if need := launcherFiles(c.MPI)*most + launcherFilesFixed; uint64(need) > lim {
			return fmt.Errorf("-n %d: more ranks on a node (%d) than its agent can hold descriptors for (%d needed, RLIMIT_NOFILE %d; see ulimit -n)", c.Size, most, need, lim)
		}
		return nil
	}
	// pmirun holds launcherFiles descriptors per running rank.
	if need := launcherFiles(c.MPI)*c.Size + launcherFilesFixed; uint64(need) > lim {
		return fmt.Errorf("-n %d: more ranks than pmirun can hold descriptors for (%d needed, RLIMIT_NOFILE %d; see ulimit -n)", c.Size, need, lim)
	}
	return nil
}

// launcherFiles is how many descriptors pmirun holds for each running
// rank it forks: its ends of the rank's PMI socket and of its two output
// pipes, and the rank's pidfd (sys.StartChild), and with PMIx the
// server library's end of the rank's connection. launcherFilesFixed is
// the rest: its own, and those of the forks in flight (a socket end, two
// pipe ends and fork's own pipe each): measured 24 to 36 here, with
// PMIx too (under "ulimit -n 256" 55 ranks ran, 43 PMIx ranks); 64
// would be all of a "ulimit -n 64", where no job could run.
func launcherFiles(mpi string) int {
	if mpi == node.MPIPMIx {
		return 5
	}
	return 4
}

const launcherFilesFixed = 40

// jobFiles is how many descriptors pmirun holds for each job it runs
// itself (its nodes: the fork bootstrap's spawned jobs): the segment's
// memfd and the ranks' /dev/null.
const jobFiles = 2

// onlyThisMachine reports whether every host names this machine
// (localNames).
func onlyThisMachine(hosts []string) bool {
	local := localNames()
	for _, h := range hosts {
		if !slices.ContainsFunc(local, func(l string) bool { return strings.EqualFold(h, l) }) {
			return false
		}
	}
	return true
}
