// Package launch is pmirun's side of a job, what only the root does: it
// validates the command line's Config, places ranks on nodes, builds the
// job's node.Spec once, starts one agent per node through a bootstrap
// (fork: a node.Node inside this process; loopback, netns, ssh, slurm:
// one pmid per node) and is the root of their tree, serves the job-wide
// services (names, abort, exit codes), collects the agents' output, and
// decides how the job ends. Everything a node does — serving its ranks,
// forking them, the tree and ring links — is package agent/node's.
//
// Model. Run owns everything it starts: the node (fork) or the agents'
// bootstrap processes and links, and every goroutine those need, which it
// waits for before it returns. A single loop (Run's own goroutine, or the
// root's in a multi-node job) receives every
// event — a rank's exit, an abort, a lost PMI connection, a signal, the
// timeout — and is the only place that decides the job's fate, so the first
// failure wins and is reported once. Run returns only after every rank
// process has been reaped and the agent closed.
//
// Failure policy (nothing waits forever):
//   - a rank that exits with a non-zero code or is killed by a signal fails
//     the job with that code (128+signal for a signal);
//   - a rank that ends with code 0 without PMI finalize fails the job if it
//     had spoken PMI, or once any other rank speaks PMI (those ranks would
//     wait for it forever); plain programs that never use PMI run as usual;
//   - MPI_Abort (PMI abort) fails the job with the abort code (1 in place
//     of a code outside 1..255, which an exit status cannot carry);
//   - a PMI connection lost before finalize whose process does not exit
//     within a grace period fails the job;
//   - the timeout fails the job with code 124.
//
// When the job fails, every remaining rank's process group gets SIGTERM and,
// after KillGrace, SIGKILL. Ranks also get SIGKILL as their parent-death
// signal, so none outlives a launcher that is itself killed.
package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
)

// ExitTimeout is pmirun's exit code when --timeout ends the job.
const ExitTimeout = 124

// DefaultTreeWidth is the agent tree's width when none is given.
const DefaultTreeWidth = 8

// Config describes a job.
type Config struct {
	Size int    // number of ranks (-n); 0 = one a slot of the nodes (unsaidSize)
	Prog string // executable
	// Apps, for an MPMD command line (pmirun's ":" segments), are its
	// commands in rank order, each with its ranks, arguments, extra
	// environment and working directory; Prog and Args are then empty
	// and Size is the sum of their ranks.
	Apps []node.App
	Args []string // its arguments
	Env  []string // extra K=V for every rank (--env)
	// EnvNone passes none of pmirun's environment to the ranks but the
	// variables named in EnvList (-genvnone, -genvlist); a non-empty
	// EnvList implies it.
	EnvNone bool
	EnvList []string
	// Wdir is the ranks' working directory; "" = pmirun's. A relative
	// path is taken from pmirun's.
	Wdir string
	// StdinRank is the rank that reads pmirun's stdin (default 0), or
	// StdinNone or StdinAll.
	StdinRank int

	// Output: Label prefixes lines with "[rank] ", TagOutput with
	// "[rank@host] ", Timestamp with the time; PrefixPattern, exclusive
	// with those, is the prefix itself (%r rank, %h host, %t time). Out-
	// and ErrPattern send each rank's stdout/stderr to a file instead
	// (%r, %h).
	Label, TagOutput, Timestamp bool
	PrefixPattern               string
	OutPattern, ErrPattern      string

	// Bind binds each rank to a CPU unit (BindUnits; "" or "none" = no
	// binding); MapBy orders a node's ranks over the units (MapUnits).
	Bind, MapBy string
	// TimerSlack is every rank's timer slack (node.Spec.TimerSlack):
	// node.TimerSlackAuto (0), node.TimerSlackOff, or a duration.
	TimerSlack time.Duration
	// Timeout ends the job after this long; 0 = none.
	Timeout time.Duration
	// UniverseSize answered to get_universe_size; -1 (or 0) = unlimited.
	// Spawned jobs may run as many processes as it leaves room for.
	UniverseSize int
	// SpawnPlacement is where a spawn's processes go: "roundrobin" (or
	// "") over the run's nodes, or "leastload", the nodes running the
	// fewest processes first.
	SpawnPlacement string
	Verbose        bool
	TracePath      string // write a Chrome trace here when non-empty
	JobID          string // "" = generated
	// ReportPath, when non-empty, is where the job's report
	// (jobreport.Report: phases, per-node counters, benchmark figures)
	// is written as JSON when the job ends, successful or not.
	ReportPath string
	// PMIPort makes ranks connect to the agent over loopback TCP
	// (PMI_PORT and PMI_ID, Hydra's -pmi-port mode) instead of inheriting
	// a PMI_FD socketpair.
	PMIPort bool
	// MPI is what ranks are served over besides PMI-1/PMI-2: "pmix"
	// serves PMIx too (Open MPI; node.MPIPMIx); "pmi" PMI only; ""
	// detects it from the programs (mpidetect.go), PMI unless one links
	// PMIx.
	MPI string
	// mpiFound says what detectMPI found, for --verbose ("" if nothing);
	// mpiDetected, that it has read the programs.
	mpiFound    string
	mpiDetected bool
	// interactive: pmirun's standard output is a terminal (Run), so a
	// rank's unfinished line is written once the rank pauses in it
	// (node.Spec.PartialLines): a prompt shows before its input is read.
	interactive bool
	// NoShm turns the shared-memory segment off: ranks get only PMI_FD
	// (or PMI_PORT).
	NoShm bool

	// Multi-node jobs (a bootstrap other than fork).
	Bootstrap  string        // fork (default), loopback, netns, ssh, slurm
	Hosts      []string      // ssh: host names; netns: namespace names
	Slots      []int         // ranks each host takes (HOST:SLOTS); nil or 0 = unsaid
	Nodes      int           // loopback: number of agents
	PPN        int           // ranks per node; 0 = spread evenly
	Cyclic     bool          // cyclic placement (rank r on node r mod K) instead of block
	TreeWidth  int           // width k of the agent tree
	Codec      string        // broadcast compression: auto, s2, zstd, none
	NetBackend string        // agent links: auto, uring, net
	NetTimeout time.Duration // a silent agent link is dead after this
	PmidPath   string        // pmid on the nodes; default: next to pmirun, else on PATH
	SSH        string        // ssh command and its options, split into words as the shell splits them (splitWords); default FASTPMI_SSH, else "ssh"
	RootAddr   string        // address agents dial pmirun at; default (ssh, slurm): the one this machine reaches the hosts from (routeAddr), else its first non-loopback address
	// KVS is the policy for keys put without a hint (auto, dense,
	// sparse), GetStrategy how a node fetches a key another node holds
	// (direct, dkvs, tree); "" = auto and direct (docs/kvs.md).
	KVS         string
	GetStrategy string

	// Daemons, when set, runs the job on running daemons (pmid --daemon)
	// at these addresses, one node each, instead of starting agents;
	// SecretFile holds the daemons' secret. Bootstrap must then be "" or
	// "fork" (validate makes it "daemon").
	Daemons    []string
	SecretFile string

	// Virtual runs the ranks as goroutines inside each agent, each using
	// the real shared-memory client, instead of processes (the scale
	// benchmark); it names the workload (see virtual.go).
	Virtual       string
	VirtualRounds int
	// VirtualLate, when positive, makes every round of the Virtual
	// workload a late arrival: the ranks first meet in an untimed
	// barrier, then global rank 0 waits VirtualLate and enters last, at
	// a machine the other ranks have left quiet. Each round's tail is
	// then the operation's own latency after its last rank arrived.
	VirtualLate time.Duration
	// VirtualWork is the compute of the Virtual workload's rounds (the
	// research's overlap and MPI_Init benchmarks; node.Spec.VirtualWork):
	// required by node.VirtualWorkWorkloads, refused by the others.
	VirtualWork time.Duration

	// KillGrace is how long ranks get between SIGTERM and SIGKILL when the
	// job is ended. Default 500ms.
	KillGrace time.Duration
	// DisconnectGrace is how long a rank whose PMI connection closed early
	// may take to exit before the job is failed. Default 1s.
	DisconnectGrace time.Duration

	Stdin          io.Reader // to rank 0; nil = /dev/null
	Stdout, Stderr io.Writer // nil = os.Stdout / os.Stderr
	Logger         *slog.Logger
	// Signals, when non-nil, delivers signals to forward to every rank.
	Signals <-chan os.Signal
}

func (c *Config) validate() error {
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.inSlurmAllocation() {
		// As Hydra and Open MPI's mpirun do: a job started inside an
		// allocation of other nodes (sbatch -N 4, salloc on a login
		// node) runs on them. It ran here alone, one rank without -n,
		// and exited 0 having used none of them.
		c.Bootstrap = "slurm"
	}
	if c.Size == 0 && len(c.Apps) == 0 {
		c.Size = c.unsaidSize()
	}
	if c.Size < 1 {
		return fmt.Errorf("invalid number of ranks %d: want at least 1", c.Size)
	}
	if c.Size > node.MaxRanks {
		return fmt.Errorf("invalid number of ranks %d: at most %d", c.Size, node.MaxRanks)
	}
	switch {
	case len(c.Apps) > 0:
		if err := c.validateApps(); err != nil {
			return err
		}
	case c.Prog == "":
		return errors.New("no program to run")
	}
	for _, kv := range c.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("invalid --env %q: want KEY=VALUE", kv)
		}
	}
	if len(c.EnvList) > 0 {
		c.EnvNone = true
	}
	if err := c.detectMPI(); err != nil {
		return err
	}
	if err := c.validatePlacement(); err != nil {
		return err
	}
	if err := node.CheckMPI(c.MPI); err != nil && !(errors.Is(err, node.ErrNoPMIx) && !c.nodeInProcess()) {
		// The agents serve PMIx ranks on other bootstraps: pmirun
		// itself needs PMIx support only for the node it runs.
		return err
	}
	if err := c.validateLinks(); err != nil {
		return err
	}
	if err := c.validateOutput(); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("invalid timeout %v", c.Timeout)
	}
	if c.UniverseSize == 0 || c.UniverseSize < -1 {
		if c.UniverseSize < -1 {
			return fmt.Errorf("invalid universe size %d", c.UniverseSize)
		}
		c.UniverseSize = -1
	}
	switch c.SpawnPlacement {
	case "":
		c.SpawnPlacement = "roundrobin"
	case "roundrobin", "leastload":
	default:
		return fmt.Errorf("invalid --spawn-placement %q: want roundrobin or leastload", c.SpawnPlacement)
	}
	if len(c.Daemons) > 0 {
		if c.Bootstrap != "" && c.Bootstrap != "fork" && c.Bootstrap != "daemon" {
			return fmt.Errorf("--daemons runs the job on running daemons: it excludes --bootstrap %s", c.Bootstrap)
		}
		if c.SecretFile == "" {
			return errors.New("--daemons needs --secret-file FILE, the daemons' secret")
		}
		for _, d := range c.Daemons {
			if _, port, err := net.SplitHostPort(d); err != nil || port == "" || port == "0" {
				return fmt.Errorf("invalid daemon address %q: want HOST:PORT", d)
			}
		}
		c.Bootstrap = "daemon"
	} else if c.Bootstrap == "daemon" {
		return errors.New("bootstrap daemon needs --daemons ADDR[,ADDR...]")
	}
	switch c.Bootstrap {
	case "", "fork", "loopback", "netns", "ssh", "slurm", "daemon":
	default:
		return fmt.Errorf("invalid bootstrap %q: want fork, loopback, netns, ssh or slurm", c.Bootstrap)
	}
	if c.TreeWidth == 0 {
		c.TreeWidth = DefaultTreeWidth
	}
	if c.PPN < 0 {
		return fmt.Errorf("invalid ranks per node %d", c.PPN)
	}
	if c.Codec == "" {
		c.Codec = "auto"
	}
	if c.NetBackend == "" {
		c.NetBackend = "auto"
	}
	if c.NetTimeout <= 0 {
		c.NetTimeout = 5 * time.Second
	}
	if c.KillGrace <= 0 {
		c.KillGrace = 500 * time.Millisecond
	}
	if c.DisconnectGrace <= 0 {
		c.DisconnectGrace = time.Second
	}
	if c.JobID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.JobID = "fastpmi-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Virtual != "" {
		if !slices.Contains(node.VirtualWorkloads, c.Virtual) {
			return fmt.Errorf("invalid --virtual %q: want one of %s", c.Virtual, strings.Join(node.VirtualWorkloads, ", "))
		}
		if !c.multiNode() {
			return errors.New("--virtual needs agents of their own (--bootstrap loopback or another multi-node bootstrap)")
		}
	}
	if err := c.validateLimits(); err != nil {
		return err
	}
	switch {
	case c.VirtualRounds < 0:
		return fmt.Errorf("invalid --virtual-rounds %d", c.VirtualRounds)
	case c.VirtualLate < 0:
		return fmt.Errorf("invalid --virtual-late %v: want 0 or more", c.VirtualLate)
	case c.VirtualLate > 0 && c.Virtual == "":
		return errors.New("--virtual-late needs --virtual")
	case c.VirtualWork != 0 && c.Virtual == "":
		return errors.New("--virtual-work needs --virtual")
	}
	if c.Virtual != "" {
		if err := node.CheckVirtualWork(c.Virtual, c.VirtualWork); err != nil {
			return fmt.Errorf("invalid --virtual-work: %w", err)
		}
	}
	return nil
}

// BlockMapping returns PMI_process_mapping for ranks placed in blocks of
// ppn per node on nnodes nodes (the last node may hold fewer).
func BlockMapping(size, nnodes, ppn int) string {
	if size <= 0 || nnodes <= 0 || ppn <= 0 {
		return ""
	}
	full := size / ppn
	rest := size % ppn
	s := "(vector"
	if full > 0 {
		s += fmt.Sprintf(",(0,%d,%d)", full, ppn)
	}
	if rest > 0 {
		s += fmt.Sprintf(",(%d,1,%d)", full, rest)
	}
	return s + ")"
}

// spec is the job as every node runs it, for the ranks placed on nodes
// (the multi-node fields are filled by runMulti).
func (c *Config) spec(nodes [][]int, mapping string) *node.Spec {
	apps := c.Apps
	if c.Prog != "" {
		apps = []node.App{{Prog: c.Prog, Args: c.Args, Size: c.Size}}
	}
	return &node.Spec{
		JobID: c.JobID, Size: c.Size, Nodes: nodes, Mapping: mapping, Usize: c.UniverseSize,
		Apps: apps, Env: c.Env, Label: c.Label, NoShm: c.NoShm, PMIPort: c.PMIPort, MPI: c.MPI,
		TreeWidth: c.TreeWidth, NetBackend: c.NetBackend, NetTimeout: c.NetTimeout,
		KillGrace: c.KillGrace, DisconnectGrace: c.DisconnectGrace, Verbose: c.Verbose,
		Virtual: c.Virtual, VirtualRounds: c.VirtualRounds, VirtualLate: c.VirtualLate, VirtualWork: c.VirtualWork,
		Trace: c.TracePath != "" || c.Verbose, // --verbose's summary needs the nodes' marks too
		Wdir:  c.Wdir, EnvNone: c.EnvNone, EnvKeep: c.EnvList, Prefix: c.prefix(),
		OutPattern: c.OutPattern, ErrPattern: c.ErrPattern, PartialLines: c.interactive, Bind: c.Bind, MapBy: c.MapBy, TimerSlack: c.TimerSlack, StdinRank: c.StdinRank,
		KVS: c.KVS, GetStrategy: c.GetStrategy,
	}
}

// validateApps checks an MPMD command line's commands.
func (c *Config) validateApps() error {
	if c.Prog != "" {
		return errors.New("both a program and MPMD commands")
	}
	sum := 0
	for i, a := range c.Apps {
		switch {
		case a.Prog == "":
			return fmt.Errorf("MPMD command %d: no program", i)
		case a.Size < 1:
			return fmt.Errorf("MPMD command %d (%s): %d ranks, want at least 1", i, a.Prog, a.Size)
		}
		for _, kv := range a.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return fmt.Errorf("MPMD command %d (%s): invalid -env %q: want KEY=VALUE", i, a.Prog, kv)
			}
		}
		sum += a.Size
	}
	if sum != c.Size {
		return fmt.Errorf("MPMD commands run %d ranks, the job has %d", sum, c.Size)
	}
	return nil
}

// multiNode reports whether the job needs agents on other nodes (a
// bootstrap other than fork).
func (c *Config) multiNode() bool { return c.Bootstrap != "" && c.Bootstrap != "fork" }

// nodeInProcess reports whether the job's node runs inside pmirun (the
// fork bootstrap): no bootstrap, hosts or daemons name other agents. It
// holds before validate too, which derives the bootstrap from those.
func (c *Config) nodeInProcess() bool {
	return !c.multiNode() && len(c.Hosts) == 0 && len(c.Daemons) == 0
}
