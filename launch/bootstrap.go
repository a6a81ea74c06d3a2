package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
)

// Bootstraps: how pmirun starts one agent (pmid) per node.
//
//   - fork: no agent process; the job runs on this machine with the agent
//     inside pmirun.
//   - loopback: Nodes agents on this machine, linked over 127.0.0.1 — the
//     multi-node protocol without a network, for tests and the scale
//     benchmark.
//   - netns: one agent per network namespace (the project's test hosts),
//     started with "ip netns exec"; pmirun itself runs in the first one.
//   - ssh: one agent per host, started with ssh.
//   - slurm: inside an allocation, one srun starts an agent on every node
//     (--ntasks-per-node=1), hosts from SLURM_JOB_NODELIST; no Slurm MPI
//     plugin is used.
//   - daemon (--daemons): no agent starts; each node of the job is
//     submitted to a running pmid --daemon (agents.go's daemonAgent),
//     which gets the spec on the submission connection.
//
// An agent gets the job Spec, including the job secret, on its standard
// input, never on a command line; what follows the spec on node 0's
// standard input is rank 0's. The agents a bootstrap starts for the
// command line's job also run the jobs the run spawns (its Hello names
// where they take them: node.Hello.Jobs), so a spawn starts no agent;
// they end when the run does.

// agentProcs is the GOMAXPROCS of each of k agents that share this
// machine (loopback and netns bootstraps): its share of the CPUs, at least
// one, or 0 (the Go default) for agents on machines of their own or when
// the caller set GOMAXPROCS. Go's scheduler assumes the process owns its
// CPUs: with more agents than cores, every agent's idle threads spin and
// hand work between each other for CPUs the other agents need (measured
// with 64 agents × 256 goroutine ranks on 2 cores: allgather rounds 25-30%
// shorter with one P per agent; docs/scale.md). The setting reaches the
// agent in its spec, not its environment, so the ranks it starts keep
// theirs.
func agentProcs(bootstrap string, k int) int {
	if bootstrap != "loopback" && bootstrap != "netns" {
		return 0
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return 0
	}
	return max(1, runtime.NumCPU()/k)
}

// hostList returns the nodes of a multi-node job: names for ssh,
// namespaces for netns, Slurm's node list, or Nodes copies of localhost.
func (c *Config) hostList() ([]string, error) {
	switch c.Bootstrap {
	case "loopback":
		if c.Nodes < 1 {
			return nil, fmt.Errorf("bootstrap loopback needs --nodes N")
		}
		h := make([]string, c.Nodes)
		for i := range h {
			h[i] = "127.0.0.1"
		}
		return h, nil
	case "daemon":
		return slices.Clone(c.Daemons), nil
	case "ssh", "netns":
		if len(c.Hosts) == 0 {
			return nil, fmt.Errorf("bootstrap %s needs --hosts or --hostfile", c.Bootstrap)
		}
		return c.Hosts, nil
	case "slurm":
		v := "SLURM_JOB_NODELIST"
		nl := os.Getenv(v)
		if nl == "" {
			v = "SLURM_NODELIST"
			nl = os.Getenv(v)
		}
		if nl == "" {
			return nil, fmt.Errorf("bootstrap slurm: SLURM_JOB_NODELIST is not set (not inside an allocation?)")
		}
		hosts, err := ExpandHostlist(nl)
		if err != nil {
			return nil, fmt.Errorf("bootstrap slurm: %s: %w", v, err)
		}
		return hosts, nil
	}
	return nil, fmt.Errorf("unknown bootstrap %q (want fork, loopback, netns, ssh or slurm)", c.Bootstrap)
}

// inSlurmAllocation reports whether a job that names no bootstrap, hosts
// or daemons runs inside a Slurm allocation (SLURM_JOB_ID and its node
// list set) that holds another node than this one: its nodes are the
// job's. An allocation of this node alone (SLURMD_NODENAME, else the
// host's names) leaves the job forked here; so does --bootstrap fork.
func (c *Config) inSlurmAllocation() bool {
	if c.Bootstrap != "" || len(c.Hosts) > 0 || len(c.Daemons) > 0 || c.Virtual != "" || os.Getenv("SLURM_JOB_ID") == "" {
		return false
	}
	nl := os.Getenv("SLURM_JOB_NODELIST")
	if nl == "" {
		nl = os.Getenv("SLURM_NODELIST")
	}
	if nl == "" {
		return false
	}
	hosts, err := ExpandHostlist(nl)
	if err != nil {
		return true // the slurm bootstrap says what is wrong with it
	}
	if me := os.Getenv("SLURMD_NODENAME"); me != "" {
		return slices.ContainsFunc(hosts, func(h string) bool { return h != me })
	}
	return !onlyThisMachine(hosts)
}

// slurmTasks is the allocation's tasks on each of its k nodes, from
// SLURM_TASKS_PER_NODE ("2(x3),1": 2, 2, 2, 1), or nil when that is
// unset, malformed or not of k nodes (inside a step it is the step's).
func slurmTasks(k int) []int {
	var tasks []int
	for item := range strings.SplitSeq(os.Getenv("SLURM_TASKS_PER_NODE"), ",") {
		n, times := item, "1"
		if a, b, ok := strings.Cut(item, "(x"); ok {
			n, times = a, strings.TrimSuffix(b, ")")
			if times == b {
				return nil
			}
		}
		c, err1 := strconv.Atoi(n)
		r, err2 := strconv.Atoi(times)
		if err1 != nil || err2 != nil || c < 1 || r < 1 || r > k-len(tasks) {
			return nil
		}
		for range r {
			tasks = append(tasks, c)
		}
	}
	if len(tasks) != k {
		return nil
	}
	return tasks
}

// sum is the sum of xs.
func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// agentCommands returns the command that starts each node's agent. For
// slurm there is one command for every node.
func (c *Config) agentCommands(ctx context.Context, hosts []string) ([]*exec.Cmd, error) {
	pmid := c.PmidPath
	if pmid == "" {
		pmid = c.defaultAgent()
	}
	var cmds []*exec.Cmd
	switch c.Bootstrap {
	case "loopback":
		for i := range hosts {
			cmds = append(cmds, exec.CommandContext(ctx, pmid, "--node", strconv.Itoa(i), "--listen", "127.0.0.1:0"))
		}
	case "netns":
		for i, h := range hosts {
			ns, _, _ := strings.Cut(h, "=")
			cmds = append(cmds, exec.CommandContext(ctx, "ip", "netns", "exec", ns, pmid, "--node", strconv.Itoa(i)))
		}
	case "ssh":
		ssh, err := splitWords(c.sshCommand()) // never blank
		if err != nil {
			return nil, err // refused by validate
		}
		local := localNames()
		for i, h := range hosts {
			if slices.ContainsFunc(local, func(l string) bool { return strings.EqualFold(h, l) }) {
				// This machine's agent starts here, as Hydra starts
				// its local host's proxy: ssh to itself needs an sshd
				// here and a key it takes, which a login node or a
				// workstation may not have.
				cmds = append(cmds, exec.CommandContext(ctx, pmid, "--node", strconv.Itoa(i)))
				continue
			}
			// The remote side is a shell command line: quote the path.
			argv := append(slices.Clone(ssh[1:]), "-o", "BatchMode=yes", "-T", h, shellQuote(pmid), "--node", strconv.Itoa(i))
			cmds = append(cmds, exec.CommandContext(ctx, ssh[0], argv...))
		}
	case "slurm":
		// One step of the allocation, an agent on each of hosts. Slurm
		// numbers a step's nodes (SLURM_NODEID) in the allocation's
		// order, which hosts keep. A spawned job runs in the first job's
		// agents (multiRun.hostd); only when they cannot host it does it
		// get a step of its own, on a subset of the nodes: --overlap
		// lets it run beside its parent's, which holds the nodes' CPUs.
		// --export=ALL: the agents get pmirun's environment, as the
		// other bootstraps' do, also where SLURM_EXPORT_ENV says NONE
		// (sbatch --export=NONE leaves it so for the batch script).
		// --cpu-bind=none: an agent is a task of one CPU to srun, which
		// under task/affinity would bind it, and every rank it forks,
		// to that CPU; unbound they have the job's CPUs on the node (as
		// Open MPI's daemons are started). --cpus-per-task=1 said here,
		// not taken from the batch script's SLURM_CPUS_PER_TASK and
		// SLURM_TRES_PER_TASK, which srun from Slurm 23.11 refuses
		// when they differ (sbatch -c 2); without --exact the step has
		// the node's CPUs all the same.
		n := strconv.Itoa(len(hosts))
		cmds = append(cmds, exec.CommandContext(ctx, "srun", "--overlap", "--nodelist="+strings.Join(hosts, ","),
			"--nodes="+n, "--ntasks="+n, "--ntasks-per-node=1", "--cpus-per-task=1",
			"--mpi=none", "--input=all", "--kill-on-bad-exit=1", "--export=ALL", "--cpu-bind=none", pmid, "--node", "slurm"))
	}
	return cmds, nil
}

// launcherEnv is pmirun's environment for agents started over ssh
// (node.Spec.LauncherEnv), without the machine's and session's own variables.
func launcherEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !node.HostLocalEnv(k) {
			env = append(env, kv)
		}
	}
	return env
}

// sshCommand is the command that runs agents over ssh: Config.SSH, else
// FASTPMI_SSH, else ssh.
func (c *Config) sshCommand() string {
	for _, s := range []string{c.SSH, os.Getenv("FASTPMI_SSH")} {
		if strings.TrimSpace(s) != "" {
			return s
		}
	}
	return "ssh"
}

// checkSSH refuses an ssh command (--ssh, FASTPMI_SSH) that cannot be
// split into words, naming where it came from.
func (c *Config) checkSSH() error {
	if c.Bootstrap != "ssh" {
		return nil
	}
	if _, err := splitWords(c.sshCommand()); err != nil {
		from := "--ssh"
		if strings.TrimSpace(c.SSH) == "" {
			from = "FASTPMI_SSH"
		}
		return fmt.Errorf("invalid %s %q: %w", from, c.sshCommand(), err)
	}
	return nil
}

// splitWords splits an ssh command into words as a shell would, without
// expanding anything: at blanks, but not within single or double quotes;
// a backslash keeps the next character (within double quotes only a
// backslash, a double quote, $ or a backquote). It split at every space,
// so "ssh -o 'ProxyCommand ssh -W %h:%p gw'" gave ssh the word
// "'ProxyCommand" and a key file's path with a space could not be given.
func splitWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune // ' or " while inside quotes
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteRune(c)
			}
		case c == '\\':
			if i+1 == len(rs) {
				return nil, errors.New("a backslash ends it")
			}
			if quote == '"' && !strings.ContainsRune("\\\"$`", rs[i+1]) {
				w.WriteRune(c)
				continue
			}
			i++
			w.WriteRune(rs[i])
			inWord = true
		case quote == '"':
			if c == '"' {
				quote = 0
			} else {
				w.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, w.String())
	}
	if len(words) == 0 {
		return nil, errors.New("no command")
	}
	return words, nil
}

// shellQuote quotes s as one word for a POSIX shell (ssh hands the remote
// command to the user's shell).
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// defaultAgent is the agent command for the nodes: pmid, or pmibench
// for a job of virtual ranks (pmid plays no virtual ranks: it does not
// link the client library they use). It is the one next to this
// executable, else the one on PATH.
func (c *Config) defaultAgent() string {
	name := "pmid"
	if c.Virtual != "" {
		name = "pmibench"
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return name
}

// rootListenAddr is where pmirun listens for its agents: the one address
// they dial (rootDialAddr), not every interface. Only a run on daemons
// that pmirun reaches from several of its addresses (each dials pmirun
// back where pmirun reached it from: agents.go) listens on all of them.
func (c *Config) rootListenAddr() string {
	switch {
	case c.Bootstrap == "loopback":
		return "127.0.0.1:0"
	case c.Bootstrap == "daemon" && c.RootAddr == "" && allLoopback(c.Daemons):
		return "127.0.0.1:0"
	case c.RootAddr != "":
		return net.JoinHostPort(c.RootAddr, "0")
	case c.Bootstrap == "daemon":
		if h := sourceAddr(c.Daemons); h != "" {
			return net.JoinHostPort(h, "0")
		}
		return ":0"
	}
	return net.JoinHostPort(firstAddr(), "0")
}

// sourceAddr is the address of this machine that reaches every one of
// addrs (a UDP socket connected to each, no packet sent), or "" if they
// are reached from different addresses or one cannot be reached. Their
// names are looked up within sourceAddrTimeout in all.
func sourceAddr(addrs []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), sourceAddrTimeout)
	defer cancel()
	var d net.Dialer
	src := ""
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "udp", a)
		if err != nil {
			return ""
		}
		h, _, _ := net.SplitHostPort(c.LocalAddr().String())
		c.Close()
		if src != "" && h != src {
			return ""
		}
		src = h
	}
	return src
}

// sourceAddrTimeout bounds sourceAddr's name lookups: a resolver that
// does not answer costs a job's start that much, not its own timeouts.
const sourceAddrTimeout = 2 * time.Second

// routeProbes is how many of a job's hosts routeAddr asks the route to.
const routeProbes = 4

// routeAddr is the address of this machine from which it reaches the
// job's other hosts (sourceAddr over the first routeProbes of them that
// are not this machine), or "" if they are reached from different
// addresses, one cannot be reached, or none is another machine. On a
// machine of several networks (a management Ethernet and the cluster's
// fabric, a bridge, a link that is down) that is the address the hosts
// can dial, where the first address of the first interface may not be.
func routeAddr(hosts []string) string {
	local := localNames()
	var probe []string
	for _, h := range hosts {
		if len(probe) == routeProbes {
			break
		}
		if slices.ContainsFunc(local, func(l string) bool { return strings.EqualFold(h, l) }) {
			continue
		}
		if a := net.JoinHostPort(h, "9"); !slices.Contains(probe, a) {
			probe = append(probe, a)
		}
	}
	if len(probe) == 0 {
		return ""
	}
	h := sourceAddr(probe)
	if ip := net.ParseIP(h); ip == nil || ip.IsLoopback() {
		return ""
	}
	return h
}

// allLoopback reports whether every address is a loopback IP or
// localhost.
func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		h, _, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

// rootDialAddr is the address agents dial, given where pmirun listens.
func (c *Config) rootDialAddr(ln net.Addr) string {
	_, port, _ := net.SplitHostPort(ln.String())
	host := c.RootAddr
	if c.Bootstrap == "loopback" {
		host = "127.0.0.1"
	}
	if host == "" {
		host = firstAddr()
	}
	return net.JoinHostPort(host, port)
}

// firstAddr is this machine's first non-loopback IPv4 address, or
// 127.0.0.1.
func firstAddr() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
				return ip.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// ExpandHostlist expands a Slurm host list such as
// "node[01-03,7],login,gpu[1-2]" into host names. As Slurm's own
// (scontrol show hostnames), an item may hold several bracket groups,
// expanded as their product with the last varying fastest
// ("rack[1-2]-n[01-02]": rack1-n01, rack1-n02, rack2-n01, rack2-n02), and
// a number keeps the width of its range's first bound (n[08-10]: n08,
// n09, n10). A bracket that is not closed, closed twice or nested is
// refused, naming the item: srun would be asked for nodes that are not
// the allocation's.
func ExpandHostlist(s string) ([]string, error) {
	var out []string
	for len(s) > 0 {
		// Split off one item at a top-level comma.
		depth, end := 0, len(s)
		for i, c := range s {
			if c == '[' {
				depth++
			} else if c == ']' {
				depth--
			} else if c == ',' && depth == 0 {
				end = i
				break
			}
		}
		item := s[:end]
		if end < len(s) {
			s = s[end+1:]
		} else {
			s = ""
		}
		if item == "" {
			continue
		}
		names, err := expandHostItem(item, maxHostlist-len(out))
		if err != nil {
			return nil, fmt.Errorf("expand host list: %w in %q", err, item)
		}
		out = append(out, names...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("expand host list: empty")
	}
	return out, nil
}

// maxHostlist bounds the names one host list expands to: more nodes than
// any cluster has, fewer than a list such as "n[0-65535]x[0-65535]" would
// make (2^32 names).
const maxHostlist = 1 << 20

// expandHostItem expands one item of a host list, PREFIX[RANGES]REST,
// into at most limit names, REST expanded in turn.
func expandHostItem(item string, limit int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.IndexByte(item, ']') >= 0 {
			return nil, errors.New("unbalanced brackets")
		}
		return []string{item}, nil
	}
	prefix := item[:open]
	end := strings.IndexByte(item[open:], ']')
	if end < 0 || strings.IndexByte(prefix, ']') >= 0 {
		return nil, errors.New("unbalanced brackets")
	}
	end += open
	inner := item[open+1 : end]
	if strings.IndexByte(inner, '[') >= 0 {
		return nil, errors.New("nested brackets")
	}
	rests, err := expandHostItem(item[end+1:], limit)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(inner, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || !digits(lo) || !digits(hi) || b < a {
			return nil, fmt.Errorf("bad range %q", r)
		}
		if b-a >= limit || (b-a+1)*len(rests) > limit-len(out) {
			return nil, fmt.Errorf("more than %d host names", maxHostlist)
		}
		for v := a; v <= b; v++ {
			for _, rest := range rests {
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, len(lo), v, rest))
			}
		}
	}
	return out, nil
}

// digits reports whether s is a decimal number without a sign.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// ReadHostfile reads one host per line: "host", "host:slots", or Open
// MPI's "host slots=N" (returned as host:N; an IPv6 address as
// [address]:N), skipping blank lines and #
// comments. Anything else on a line is refused, naming the line: the
// job would run otherwise than the file says.
func ReadHostfile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read hostfile: %w", err)
	}
	var hosts []string
	for n, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		host := f[0]
		for _, w := range f[1:] {
			slots, ok := strings.CutPrefix(w, "slots=")
			if !ok || hasSlots(host) {
				return nil, fmt.Errorf("read hostfile %s: line %d: %q after the host: want HOST, HOST:SLOTS or HOST slots=SLOTS", path, n+1, w)
			}
			if strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "[") {
				host = "[" + host + "]" // an IPv6 address: fd00::2 slots=4 is [fd00::2]:4
			}
			host += ":" + slots
		}
		hosts = append(hosts, host)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("read hostfile %s: no hosts", path)
	}
	return hosts, nil
}

// hasSlots reports whether a hostfile's host names its slots: HOST:SLOTS
// or [IPV6ADDRESS]:SLOTS, not an IPv6 address alone.
func hasSlots(host string) bool {
	if strings.HasPrefix(host, "[") {
		return strings.Contains(host, "]:")
	}
	return strings.Count(host, ":") == 1
}

// ReadDaemonFile reads daemon addresses for --daemons @FILE: one
// HOST:PORT per line (first field), skipping blank lines and # comments.
func ReadDaemonFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read daemon file: %w", err)
	}
	var addrs []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		if f := strings.Fields(line); len(f) > 0 {
			addrs = append(addrs, f[0])
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("read daemon file %s: no addresses", path)
	}
	return addrs, nil
}
