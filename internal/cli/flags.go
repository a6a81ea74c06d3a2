package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/launch"
)

// Flag is one option of pmirun: every spelling it accepts, its values and
// what it does. The table (Flags) is the single source of --help, the man
// page and the bash completion, so they cannot drift from the parser.
type Flag struct {
	// Names are the spellings shown, the first the canonical one. The
	// parser accepts each with one or two leading dashes, as Hydra does.
	Names []string
	Arg   string // metavariable of the value(s), "" for a switch
	Nargs int    // values taken: 0 (switch), 1, or 2 (-genv KEY VALUE)
	Group string
	Help  string
	// Choices are the values a completion offers; Files says the value
	// is a path.
	Choices []string
	Files   bool
	// Repeat allows the flag more than once (each use adds); any other
	// flag given twice, under any of its names, is an error.
	Repeat bool
	set    func(p *parser, v []string) error
}

// Groups orders the sections of --help and the man page.
var Groups = []string{"job", "placement", "environment", "output", "multi-node", "debugging", "benchmarking", "information"}

// Flags returns pmirun's options in --help order.
func Flags() []*Flag { return flagTable }

var flagTable = []*Flag{
	// job
	{Names: []string{"-n", "-np", "--ntasks"}, Arg: "N", Nargs: 1, Group: "job",
		Help: "number of ranks (default: one a slot of the nodes, as Hydra: HOST:SLOTS, 1 a host without, or -ppn a node; under --bootstrap slurm SLURM_NTASKS, as srun; 1 on this machine alone)",
		set:  func(p *parser, v []string) error { return posInt(v[0], &p.cfg.Size) }},
	{Names: []string{"-configfile"}, Arg: "FILE", Nargs: 1, Group: "job", Files: true,
		Help: "read the commands from FILE, one MPMD segment a line (\"-n N [-env K V] [-wdir DIR] program args\"; # starts a comment) instead of the command line",
		set:  func(p *parser, v []string) error { p.configFile = v[0]; return nil }},
	{Names: []string{"-wdir", "--chdir", "-D"}, Arg: "DIR", Nargs: 1, Group: "job", Files: true,
		Help: "working directory of the ranks (default: pmirun's); a relative program path is found from it",
		set:  func(p *parser, v []string) error { p.cfg.Wdir = v[0]; return nil }},
	{Names: []string{"--timeout"}, Arg: "DURATION", Nargs: 1, Group: "job",
		Help: "end the job after DURATION (30, 30s, 2m; a bare number is seconds); exit code 124. Default: MPIEXEC_TIMEOUT, as for mpiexec, else none",
		set:  func(p *parser, v []string) error { return duration(v[0], 0, &p.cfg.Timeout) }},
	{Names: []string{"-i", "--stdin", "--input"}, Arg: "WHO", Nargs: 1, Group: "job", Choices: []string{"0", "all", "none"},
		Help: "who reads pmirun's standard input: a rank number (default 0), all, or none (like srun --input)",
		set:  func(p *parser, v []string) error { return stdinRank(v[0], &p.cfg.StdinRank) }},
	{Names: []string{"--mpi"}, Arg: "TYPE", Nargs: 1, Group: "job", Choices: []string{node.MPIPMI, node.MPIPMIx},
		Help: "what ranks may speak: pmi (PMI-1/PMI-2) or pmix (PMIx as well, for Open MPI; needs a build with PMIx support); default: pmix if a program links Open MPI or OpenPMIx, else pmi",
		set:  func(p *parser, v []string) error { p.cfg.MPI = v[0]; return nil }},
	{Names: []string{"--usize"}, Arg: "N", Nargs: 1, Group: "job",
		Help: "universe size answered to get_universe_size (default -1, unlimited)",
		set: func(p *parser, v []string) error {
			n, err := strconv.Atoi(v[0])
			if err != nil || (n < 1 && n != -1) {
				return fmt.Errorf("want a positive number or -1 (unlimited), got %q", v[0])
			}
			p.cfg.UniverseSize = n
			return nil
		}},

	// placement
	{Names: []string{"--spawn-placement"}, Arg: "HOW", Nargs: 1, Group: "placement", Choices: []string{"roundrobin", "leastload"},
		Help: "where spawned processes go: roundrobin over the nodes (default), or leastload (the nodes running the fewest processes first)",
		set:  func(p *parser, v []string) error { p.cfg.SpawnPlacement = v[0]; return nil }},
	{Names: []string{"-hosts", "-host", "--nodelist", "-w"}, Arg: "HOST[,HOST...]", Nargs: 1, Group: "placement",
		Help: "nodes to run on, one agent each (HOST:SLOTS sets its ranks); hosts without --bootstrap start over ssh, as Hydra does (this machine alone: forked here)",
		set:  func(p *parser, v []string) error { return p.addHosts(strings.Split(v[0], ",")) }},
	{Names: []string{"-f", "-hostfile", "-machinefile"}, Arg: "FILE", Nargs: 1, Group: "placement", Files: true,
		Help: "file of nodes, one a line: HOST, HOST:SLOTS or HOST slots=SLOTS; # starts a comment",
		set: func(p *parser, v []string) error {
			hs, err := launch.ReadHostfile(v[0])
			if err != nil {
				return err
			}
			return p.addHosts(hs)
		}},
	{Names: []string{"-ppn", "--ntasks-per-node"}, Arg: "N", Nargs: 1, Group: "placement",
		Help: "ranks per node (default: HOST:SLOTS, else spread evenly)",
		set:  func(p *parser, v []string) error { return posInt(v[0], &p.cfg.PPN) }},
	{Names: []string{"--cyclic"}, Group: "placement",
		Help: "cyclic placement over nodes: rank r on node r mod nodes (default block); with HOST:SLOTS the nodes with slots free take a rank each in turn",
		set:  func(p *parser, v []string) error { p.cfg.Cyclic = true; return nil }},
	{Names: []string{"-bind-to"}, Arg: "UNIT", Nargs: 1, Group: "placement", Choices: launch.BindUnits,
		Help: "bind each rank to one core, hwthread or socket of the CPUs pmirun may use, or none (default)",
		set:  func(p *parser, v []string) error { p.cfg.Bind = v[0]; return nil }},
	{Names: []string{"-map-by"}, Arg: "UNIT", Nargs: 1, Group: "placement", Choices: launch.MapUnits,
		Help: "order in which a node's ranks take the binding units: core or hwthread (default: consecutive), socket (round robin over sockets)",
		set:  func(p *parser, v []string) error { p.cfg.MapBy = v[0]; return nil }},
	{Names: []string{"--timer-slack"}, Arg: "auto|off|DURATION", Nargs: 1, Group: "placement", Choices: []string{"auto", "off"},
		Help: "how late the kernel may end the ranks' timed sleeps, to end several at once: auto (default) sets 1ms on a node running more ranks than CPUs, so that ranks waiting in short sleeps (Open MPI's start-up) leave the CPUs to the ranks still starting; off (or 0) leaves the ranks pmirun's own; a duration up to 1s sets it on every rank",
		set:  func(p *parser, v []string) error { return timerSlack(v[0], &p.cfg.TimerSlack) }},

	// environment
	{Names: []string{"-genv"}, Arg: "KEY VALUE", Nargs: 2, Group: "environment", Repeat: true,
		Help: "set KEY to VALUE in every rank's environment (repeatable)",
		set:  func(p *parser, v []string) error { return p.addEnv(v[0] + "=" + v[1]) }},
	{Names: []string{"--env"}, Arg: "KEY=VALUE", Nargs: 1, Group: "environment", Repeat: true,
		Help: "set KEY=VALUE in every rank's environment (repeatable); -env KEY VALUE, with one dash as Hydra spells it, sets it for the first command's ranks only (an MPMD segment's -env for its own)",
		set:  func(p *parser, v []string) error { return p.addEnv(v[0]) }},
	{Names: []string{"-genvall"}, Group: "environment",
		Help: "pass pmirun's whole environment to the ranks (the default)",
		set:  func(p *parser, v []string) error { return p.envMode("-genvall") }},
	{Names: []string{"-genvnone"}, Group: "environment",
		Help: "pass none of pmirun's environment: ranks get only the PMI variables and -genv/--env",
		set:  func(p *parser, v []string) error { return p.envMode("-genvnone") }},
	{Names: []string{"-genvlist"}, Arg: "KEY[,KEY...]", Nargs: 1, Group: "environment",
		Help: "pass only these variables of pmirun's environment",
		set: func(p *parser, v []string) error {
			if err := p.envMode("-genvlist"); err != nil {
				return err
			}
			for k := range strings.SplitSeq(v[0], ",") {
				if k == "" || strings.Contains(k, "=") {
					return fmt.Errorf("want variable names separated by commas, got %q", v[0])
				}
				p.cfg.EnvList = append(p.cfg.EnvList, k)
			}
			return nil
		}},

	// output
	{Names: []string{"-l", "--label", "-prepend-rank"}, Group: "output",
		Help: "prefix every output line with [rank]",
		set:  func(p *parser, v []string) error { p.cfg.Label = true; return nil }},
	{Names: []string{"--tag-output"}, Group: "output",
		Help: "prefix every output line with [rank@node]: the node's host name, with a suffix where nodes share one",
		set:  func(p *parser, v []string) error { p.cfg.TagOutput = true; return nil }},
	{Names: []string{"--timestamp-output"}, Group: "output",
		Help: "prefix every output line with the time it was read (UTC, microseconds)",
		set:  func(p *parser, v []string) error { p.cfg.Timestamp = true; return nil }},
	{Names: []string{"-prepend-pattern"}, Arg: "PATTERN", Nargs: 1, Group: "output",
		Help: "prefix every output line with PATTERN: %r rank, %h node name, %t time, %% a percent sign",
		set:  func(p *parser, v []string) error { p.cfg.PrefixPattern = v[0]; return nil }},
	{Names: []string{"-outfile-pattern", "--output", "-o"}, Arg: "PATTERN", Nargs: 1, Group: "output", Files: true,
		Help: "write each rank's stdout to a file named by PATTERN (%r rank, %h node name), relative to the working directory",
		set:  func(p *parser, v []string) error { p.cfg.OutPattern = v[0]; return nil }},
	{Names: []string{"-errfile-pattern", "--error", "-e"}, Arg: "PATTERN", Nargs: 1, Group: "output", Files: true,
		Help: "write each rank's stderr to a file named by PATTERN (%r rank, %h node name)",
		set:  func(p *parser, v []string) error { p.cfg.ErrPattern = v[0]; return nil }},

	// multi-node
	{Names: []string{"--bootstrap", "-launcher"}, Arg: "B", Nargs: 1, Group: "multi-node", Choices: []string{"fork", "ssh", "slurm", "netns", "loopback"},
		Help: "how agents start: fork (this machine, the default without hosts), ssh (the default with hosts), slurm (inside an allocation; the default in one that holds other nodes than this, as Hydra's), netns (test hosts), loopback (several agents here)",
		set:  func(p *parser, v []string) error { p.cfg.Bootstrap = v[0]; return nil }},
	{Names: []string{"--nodes"}, Arg: "K", Nargs: 1, Group: "multi-node",
		Help: "number of agents for --bootstrap loopback",
		set:  func(p *parser, v []string) error { return posInt(v[0], &p.cfg.Nodes) }},
	{Names: []string{"--tree-width"}, Arg: "K", Nargs: 1, Group: "multi-node",
		Help: fmt.Sprintf("width of the agent tree (default %d)", launch.DefaultTreeWidth),
		set:  func(p *parser, v []string) error { return posInt(v[0], &p.cfg.TreeWidth) }},
	{Names: []string{"--kvs"}, Arg: "POLICY", Nargs: 1, Group: "multi-node", Choices: []string{"auto", "dense", "sparse"},
		Help: "keys put without a hint: dense travel with the fence, sparse are fetched on demand, auto (default) dense unless a node's share of a fence passes 64 KiB",
		set:  func(p *parser, v []string) error { p.cfg.KVS = v[0]; return nil }},
	{Names: []string{"--get-strategy"}, Arg: "S", Nargs: 1, Group: "multi-node", Choices: []string{"direct", "dkvs", "tree"},
		Help: "how a node fetches a sparse key: direct (default; to the source rank's node, else as dkvs), dkvs (the key's hash owner), tree (up the agent tree)",
		set:  func(p *parser, v []string) error { p.cfg.GetStrategy = v[0]; return nil }},
	{Names: []string{"--compress"}, Arg: "CODEC", Nargs: 1, Group: "multi-node", Choices: launch.Codecs,
		Help: "broadcast compression: auto (default), s2, zstd, none",
		set:  func(p *parser, v []string) error { p.cfg.Codec = v[0]; return nil }},
	{Names: []string{"--netio"}, Arg: "BACKEND", Nargs: 1, Group: "multi-node", Choices: launch.NetBackends,
		Help: "agent links: auto, uring, net (default: FASTPMI_NETIO, else auto)",
		set:  func(p *parser, v []string) error { p.cfg.NetBackend = v[0]; return nil }},
	{Names: []string{"--net-timeout"}, Arg: "DURATION", Nargs: 1, Group: "multi-node",
		Help: fmt.Sprintf("an agent link silent this long is dead (default 5s, at least %v)", launch.MinNetTimeout),
		set:  func(p *parser, v []string) error { return duration(v[0], launch.MinNetTimeout, &p.cfg.NetTimeout) }},
	{Names: []string{"--ssh", "-launcher-exec", "-bootstrap-exec"}, Arg: "COMMAND", Nargs: 1, Group: "multi-node",
		Help: "command (with options) that starts agents over ssh (default: FASTPMI_SSH, else ssh); Hydra's -launcher-exec",
		set:  func(p *parser, v []string) error { p.cfg.SSH = v[0]; return nil }},
	{Names: []string{"--pmid"}, Arg: "PATH", Nargs: 1, Group: "multi-node", Files: true,
		Help: "path of pmid on the nodes (default: next to pmirun, else on PATH); a relative path is taken from pmirun's directory",
		set:  func(p *parser, v []string) error { p.cfg.PmidPath = v[0]; return nil }},
	{Names: []string{"--root-addr"}, Arg: "IP", Nargs: 1, Group: "multi-node",
		Help: "address agents reach pmirun at (default: under ssh and Slurm the one this machine reaches the hosts from, else its first non-loopback address)",
		set:  func(p *parser, v []string) error { p.cfg.RootAddr = v[0]; return nil }},
	{Names: []string{"--daemons"}, Arg: "ADDR[,ADDR...]|@FILE", Nargs: 1, Group: "multi-node",
		Help: "run on running daemons (pmid --daemon), one node each; @FILE holds one HOST:PORT a line; excludes --bootstrap",
		set: func(p *parser, v []string) error {
			if path, ok := strings.CutPrefix(v[0], "@"); ok {
				d, err := launch.ReadDaemonFile(path)
				p.cfg.Daemons = d
				return err
			}
			p.cfg.Daemons = strings.Split(v[0], ",")
			return nil
		}},
	{Names: []string{"--secret-file"}, Arg: "FILE", Nargs: 1, Group: "multi-node", Files: true,
		Help: "the daemons' secret (mode 0600), for --daemons",
		set:  func(p *parser, v []string) error { p.cfg.SecretFile = v[0]; return nil }},

	// debugging
	{Names: []string{"--verbose", "-v"}, Group: "debugging",
		Help: "log launcher decisions and print a start-up summary on stderr",
		set:  func(p *parser, v []string) error { p.cfg.Verbose = true; return nil }},
	{Names: []string{"--trace"}, Arg: "FILE", Nargs: 1, Group: "debugging", Files: true,
		Help: "write a Chrome trace (Perfetto) of start-up to FILE",
		set:  func(p *parser, v []string) error { p.cfg.TracePath = v[0]; return nil }},
	{Names: []string{"--report"}, Arg: "FILE", Nargs: 1, Group: "debugging", Files: true,
		Help: "write the job's report (JSON: phases, counters, exit) to FILE when it ends",
		set:  func(p *parser, v []string) error { p.cfg.ReportPath = v[0]; return nil }},
	{Names: []string{"--no-shm"}, Group: "debugging",
		Help: "no shared-memory segment: ranks use only the PMI text protocol",
		set:  func(p *parser, v []string) error { p.cfg.NoShm = true; return nil }},
	{Names: []string{"--pmi-port"}, Group: "debugging",
		Help: "ranks connect over loopback TCP (PMI_PORT, PMI_ID) instead of PMI_FD",
		set:  func(p *parser, v []string) error { p.cfg.PMIPort = true; return nil }},

	// benchmarking
	{Names: []string{"--virtual"}, Arg: "WORKLOAD", Nargs: 1, Group: "benchmarking", Choices: node.VirtualWorkloads,
		Help: "play the ranks as goroutines in the agents, running WORKLOAD (" + strings.Join(node.VirtualWorkloads, ", ") + "); the program is not run",
		set:  func(p *parser, v []string) error { p.cfg.Virtual = v[0]; return nil }},
	{Names: []string{"--virtual-rounds"}, Arg: "R", Nargs: 1, Group: "benchmarking",
		Help: fmt.Sprintf("timed rounds of the --virtual workload (default %d)", node.DefaultVirtualRounds),
		set:  func(p *parser, v []string) error { return posInt(v[0], &p.cfg.VirtualRounds) }},
	{Names: []string{"--virtual-late"}, Arg: "DURATION", Nargs: 1, Group: "benchmarking",
		Help: "rank 0 of the --virtual workload enters every round this long after the others",
		set:  func(p *parser, v []string) error { return duration(v[0], 0, &p.cfg.VirtualLate) }},
	{Names: []string{"--virtual-work"}, Arg: "DURATION", Nargs: 1, Group: "benchmarking",
		Help: "each rank of a --virtual paper-*-sleep, -spin or paper-init-* workload computes this long per round (pmibench -paper)",
		set:  func(p *parser, v []string) error { return duration(v[0], time.Nanosecond, &p.cfg.VirtualWork) }},

	// information
	{Names: []string{"--help", "-h"}, Group: "information",
		Help: "print this help on stdout and exit 0",
		set:  func(p *parser, v []string) error { return ErrHelp }},
	{Names: []string{"--version", "-V"}, Group: "information",
		Help: "print the version and VCS revision and exit 0",
		set:  func(p *parser, v []string) error { return ErrVersion }},
}

// posInt parses a positive integer.
func posInt(s string, dst *int) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want a positive whole number, got %q", s)
	}
	*dst = n
	return nil
}

// timerSlack parses --timer-slack.
func timerSlack(s string, dst *time.Duration) error {
	switch s {
	case "auto":
		*dst = node.TimerSlackAuto
		return nil
	case "off":
		*dst = node.TimerSlackOff
		return nil
	}
	d, err := ParseDuration(s)
	if err != nil || d < 0 || d > node.MaxTimerSlack {
		return fmt.Errorf("want auto, off or a duration of at most %v, got %q", node.MaxTimerSlack, s)
	}
	if d == 0 {
		d = node.TimerSlackOff
	}
	*dst = d
	return nil
}

// duration parses a Go duration or a bare number of seconds (what users
// of mpiexec and srun type), at least min.
func duration(s string, min time.Duration, dst *time.Duration) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	if d < min || d < 0 {
		if min > 0 {
			return fmt.Errorf("want at least %v, got %q", min, s)
		}
		return fmt.Errorf("want 0 or more, got %q", s)
	}
	*dst = d
	return nil
}

// ParseDuration reads "90", "1.5" (seconds) or a Go duration ("2m30s").
func ParseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || f > float64(1<<62)/float64(time.Second) {
			return 0, fmt.Errorf("want a duration of 0 or more, got %q", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want seconds or a duration such as 30s or 2m, got %q", s)
	}
	return d, nil
}

// stdinRank parses -i: a rank, all or none.
func stdinRank(s string, dst *int) error {
	switch s {
	case "all":
		*dst = launch.StdinAll
	case "none":
		*dst = launch.StdinNone
	default:
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("want a rank number, all or none, got %q", s)
		}
		*dst = n
	}
	return nil
}
