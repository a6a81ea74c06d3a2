// Package cli parses the command lines of pmirun and pmid into a
// launch.Config. Flags feel like mpiexec's and srun's: -n/-np, -l/--label,
// --env K=V (repeatable), --verbose, --timeout, --trace, --report,
// --usize. Parsing stops at the program name, so the program's own flags
// pass through untouched.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/launch"
)

type envList []string

func (e *envList) String() string { return strings.Join(*e, ",") }
func (e *envList) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

// ErrHelp is returned when the user asked for usage.
var ErrHelp = flag.ErrHelp

// Parse parses args (without the program name) for command name.
func Parse(name string, args []string, stderr io.Writer) (launch.Config, error) {
	var cfg launch.Config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var env envList
	fs.IntVar(&cfg.Size, "n", 1, "number of ranks")
	fs.IntVar(&cfg.Size, "np", 1, "number of ranks (same as -n)")
	fs.BoolVar(&cfg.Label, "l", false, "prefix each output line with [rank]")
	fs.BoolVar(&cfg.Label, "label", false, "prefix each output line with [rank] (same as -l)")
	fs.Var(&env, "env", "set `KEY=VALUE` in every rank's environment (repeatable)")
	fs.BoolVar(&cfg.Verbose, "verbose", false, "log launcher decisions and print a start-up summary")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "end the job after `DURATION` (e.g. 30s); exit code 124")
	fs.StringVar(&cfg.TracePath, "trace", "", "write a Chrome trace (Perfetto) of start-up to `FILE`")
	fs.StringVar(&cfg.ReportPath, "report", "", "write the job's report (JSON: phases, per-node counters, benchmark figures) to `FILE` when it ends")
	fs.BoolVar(&cfg.NoShm, "no-shm", false, "no shared-memory segment: ranks use only the PMI text protocol")
	fs.BoolVar(&cfg.PMIPort, "pmi-port", false, "ranks connect over loopback TCP (PMI_PORT, PMI_ID) instead of PMI_FD")
	var hosts, hostfile string
	fs.StringVar(&cfg.Bootstrap, "bootstrap", "fork", "how agents start: fork (this machine), loopback, netns, ssh, slurm")
	fs.StringVar(&hosts, "hosts", "", "comma-separated hosts (ssh) or network namespaces (netns)")
	fs.StringVar(&hostfile, "hostfile", "", "file with one host per line (ssh)")
	fs.IntVar(&cfg.Nodes, "nodes", 0, "number of agents for --bootstrap loopback")
	fs.IntVar(&cfg.PPN, "ppn", 0, "ranks per node (default: spread evenly)")
	fs.BoolVar(&cfg.Cyclic, "cyclic", false, "cyclic placement: rank r on node r mod nodes (default block)")
	fs.IntVar(&cfg.TreeWidth, "tree-width", 0, "width of the agent tree (default 8)")
	fs.StringVar(&cfg.Codec, "compress", "auto", "broadcast compression: auto, s2, zstd, none")
	fs.StringVar(&cfg.NetBackend, "netio", "", "agent links: auto, uring, net (default: FASTPMI_NETIO or auto)")
	fs.DurationVar(&cfg.NetTimeout, "net-timeout", 5*time.Second, "an agent link silent this long is dead")
	fs.StringVar(&cfg.SSH, "ssh", "", "`COMMAND` (with options) that starts agents for --bootstrap ssh (default: FASTPMI_SSH or ssh)")
	fs.StringVar(&cfg.PmidPath, "pmid", "", "path of pmid on the nodes (default: next to pmirun, else on PATH)")
	fs.StringVar(&cfg.RootAddr, "root-addr", "", "address agents reach pmirun at (default: first non-loopback address)")
	var daemons string
	fs.StringVar(&daemons, "daemons", "", "run on running daemons (pmid --daemon), one node each: `ADDR[,ADDR...]` or @FILE (one HOST:PORT a line); excludes --bootstrap")
	fs.StringVar(&cfg.SecretFile, "secret-file", "", "the daemons' secret `FILE` (mode 0600), for --daemons")
	fs.IntVar(&cfg.UniverseSize, "usize", -1, "universe size answered to get_universe_size (-1 = unlimited)")
	fs.StringVar(&cfg.SpawnPlacement, "spawn-placement", "roundrobin", "where spawned processes go: roundrobin over the nodes, or leastload (nodes running the fewest processes first)")
	fs.StringVar(&cfg.Virtual, "virtual", "", "run the ranks as goroutines inside the agents, playing `WORKLOAD` ("+strings.Join(node.VirtualWorkloads, ", ")+"); the program is not run")
	fs.IntVar(&cfg.VirtualRounds, "virtual-rounds", 0, fmt.Sprintf("timed rounds of the --virtual workload (default %d)", node.DefaultVirtualRounds))
	fs.DurationVar(&cfg.VirtualLate, "virtual-late", 0, "make rank 0 of the --virtual workload arrive this long after the others in every round (0 = rounds back to back)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s -n N [options] program [args...]\n\noptions:\n", name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.Env = env
	if hosts != "" {
		cfg.Hosts = strings.Split(hosts, ",")
	}
	if hostfile != "" {
		h, err := launch.ReadHostfile(hostfile)
		if err != nil {
			return cfg, err
		}
		cfg.Hosts = append(cfg.Hosts, h...)
	}
	if daemons != "" {
		if path, ok := strings.CutPrefix(daemons, "@"); ok {
			d, err := launch.ReadDaemonFile(path)
			if err != nil {
				return cfg, err
			}
			cfg.Daemons = d
		} else {
			cfg.Daemons = strings.Split(daemons, ",")
		}
		if explicitBootstrap(fs) {
			return cfg, fmt.Errorf("--daemons runs the job on running daemons: it excludes --bootstrap %s", cfg.Bootstrap)
		}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return cfg, errors.New("no program given")
	}
	cfg.Prog, cfg.Args = rest[0], rest[1:]
	// launch.Config's validation is the one check of every value, but
	// for what its zero values cannot tell apart.
	if cfg.UniverseSize == 0 {
		return cfg, errors.New("invalid --usize 0: want a positive number or -1 (unlimited)")
	}
	return cfg, nil
}

// explicitBootstrap reports whether --bootstrap was given other than fork.
func explicitBootstrap(fs *flag.FlagSet) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "bootstrap" && f.Value.String() != "fork" {
			given = true
		}
	})
	return given
}
