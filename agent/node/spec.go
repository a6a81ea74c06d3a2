package node

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// Spec is one job as every node of it runs it: the root (pmirun) builds
// it once from its command line, and every agent consumes it as it is —
// in pmirun's own process for the fork bootstrap, from its standard input
// for pmid. It is the same for every node; a node learns its index from
// pmid's --node flag or SLURM_NODEID.
type Spec struct {
	JobID   string  `json:"jobid"`
	Size    int     `json:"size"`
	Nodes   [][]int `json:"nodes"` // global ranks of each node, local order
	Mapping string  `json:"mapping"`
	// Usize is answered to get_universe_size / universeSize; -1 means
	// unlimited.
	Usize int `json:"usize"`
	// Apps are the job's commands, in rank order: App 0 runs ranks
	// 0..Apps[0].Size-1, and so on; a rank's appnum is its App's index.
	Apps []App    `json:"apps"`
	Env  []string `json:"env"` // KEY=VALUE added to every rank's environment
	// Wdir is pmirun's working directory, where every node starts its
	// ranks (and resolves a relative program path) unless their App says
	// otherwise. "" = the agent's own.
	Wdir string `json:"wdir,omitempty"`
	// Jobno numbers the jobs of one pmirun: 0 for the command line's, 1,
	// 2, ... for the jobs its ranks spawn, in spawn order. Labels and
	// messages name a spawned job's ranks "jobno,rank".
	Jobno int `json:"jobno,omitempty"`
	// SpawnerJobID, for a spawned job, is its parent's job id (PMI-2
	// spawner-jobid; the ranks also get PMI_SPAWNED=1).
	SpawnerJobID string `json:"spawner,omitempty"`
	// SpawnerRank is the rank of that job that asked for it (PMIx's
	// PMIX_PARENT_ID).
	SpawnerRank int `json:"spawner_rank,omitempty"`
	// Preput are the keys the spawner put in the job's KVS, readable
	// before the job's first fence (MPICH's PARENT_ROOT_PORT_NAME).
	Preput []pmiwire.Pair `json:"preput,omitempty"`
	// LauncherEnv, for agents started over ssh, is pmirun's environment:
	// the node gives it to its ranks in place of the login environment
	// sshd gave the agent, keeping the machine's and session's own
	// variables (HostLocalEnv), as ranks started any other way inherit
	// pmirun's. Nil = the agent's own environment.
	LauncherEnv []string `json:"launcher_env,omitempty"`
	Label       bool     `json:"label"` // Prefix "[%r] " when Prefix is ""
	// Umask, for a daemon's nodes, is pmirun's file mode creation mask,
	// the ranks' as it is of ranks started any other way (srun's too):
	// the daemon's own is whatever started it. Nil = the agent's own.
	Umask *int `json:"umask,omitempty"`
	// EnvNone passes none of the launch environment to the ranks but the
	// variables named in EnvKeep (-genvnone, -genvlist).
	EnvNone bool     `json:"env_none,omitempty"`
	EnvKeep []string `json:"env_keep,omitempty"`
	// Prefix is the pattern put before each output line (Prefix type:
	// %r, %h, %t); "" puts none.
	Prefix string `json:"prefix,omitempty"`
	// OutPattern and ErrPattern, when set, name a file per rank (%r,
	// %h; relative to Wdir) that takes its stdout or stderr instead of
	// the job's output.
	OutPattern string `json:"out_pattern,omitempty"`
	ErrPattern string `json:"err_pattern,omitempty"`
	// PartialLines writes a rank's unfinished line once the rank pauses
	// in it (a prompt): pmirun's output is a terminal (Output).
	PartialLines bool `json:"partial_lines,omitempty"`
	// Bind binds each rank to a core, hwthread or socket of the CPUs the
	// agent may use ("" = no binding); MapBy orders the node's ranks over
	// those units: "core"/"hwthread"/"" in order, "socket" round robin
	// over sockets.
	Bind  string `json:"bind,omitempty"`
	MapBy string `json:"map_by,omitempty"`
	// TimerSlack is the timer slack each rank starts with (see
	// rankSlack): TimerSlackAuto, TimerSlackOff, or a duration of at most
	// MaxTimerSlack set on every rank.
	TimerSlack time.Duration `json:"timer_slack,omitempty"`
	// StdinRank reads the job's input (default rank 0); -1 none, -2 all
	// (one node only).
	StdinRank int  `json:"stdin_rank,omitempty"`
	NoShm     bool `json:"noshm"`
	// PMIPort makes ranks connect to their agent over loopback TCP
	// (PMI_PORT and PMI_ID) instead of inheriting a PMI_FD socketpair.
	PMIPort bool `json:"pmiport,omitempty"`
	// MPI is the process-management interface ranks are served over
	// besides PMI-1/PMI-2: "pmix" also serves PMIx (Open MPI) through
	// OpenPMIx's server library (agent/pmix; pmix.go); "" or "pmi" only
	// PMI.
	MPI string `json:"mpi,omitempty"`
	// Root is where agents dial pmirun ("" for the fork bootstrap, whose
	// node runs inside pmirun).
	Root       string        `json:"root,omitempty"`
	TreeWidth  int           `json:"treewidth"`
	NetBackend string        `json:"netio"`
	NetTimeout time.Duration `json:"nettimeout"`
	// KillGrace is how long ranks get between SIGTERM and SIGKILL when the
	// job is ended; DisconnectGrace how long a rank whose PMI connection
	// closed early may take to exit before the job is failed.
	KillGrace       time.Duration `json:"killgrace"`
	DisconnectGrace time.Duration `json:"disconnectgrace"`
	Secret          []byte        `json:"secret,omitempty"`
	Verbose         bool          `json:"verbose"`
	// Virtual names a built-in workload that the agent plays with
	// goroutine ranks (the scale benchmark) instead of forking Prog; only
	// an agent built with a Starter for it (pmibench's) can run it.
	Virtual       string        `json:"virtual,omitempty"`
	VirtualRounds int           `json:"virtual_rounds,omitempty"`
	VirtualLate   time.Duration `json:"virtual_late,omitempty"`
	// VirtualWork is the compute of a workload in VirtualWorkWorkloads
	// (benchmark only: the research's overlap and MPI_Init figures, see
	// internal/virtual): how long each rank sleeps or spins between
	// starting a non-blocking collective and waiting for it, or its local
	// initialisation work. It is required by those workloads, at most
	// MaxVirtualWork, and refused by every other.
	VirtualWork time.Duration `json:"virtual_work,omitempty"`
	// AgentProcs, when set, is each agent process's GOMAXPROCS: several
	// agents share this machine (see launch's agentProcs). The agent's
	// command applies it; a node never changes process-wide settings.
	AgentProcs int `json:"agent_procs,omitempty"`
	// KVS is the policy for keys put without a hint (agent.ParseKVSPolicy:
	// "auto", "dense", "sparse"; "" = auto), GetStrategy how a node
	// fetches a key it does not hold (ParseStrategy: "direct", "dkvs",
	// "tree"; "" = direct). See docs/kvs.md.
	KVS         string `json:"kvs,omitempty"`
	GetStrategy string `json:"get_strategy,omitempty"`
	// Trace makes every node record a trace (perf.NewTracer) and send its
	// events, with its clock offset to pmirun, at the end (pmirun --trace).
	Trace bool `json:"trace,omitempty"`
}

// App is one command of a job: Size consecutive ranks run Prog with Args
// (pmirun's command line, one of its ":" segments, or one command of a
// spawn).
type App struct {
	Prog string   `json:"prog"`
	Args []string `json:"args,omitempty"`
	Size int      `json:"size"`
	// Env is added to the environment of this App's ranks, after
	// Spec.Env.
	Env []string `json:"env,omitempty"`
	// Wdir is where this App's ranks start; "" = Spec.Wdir.
	Wdir string `json:"wdir,omitempty"`
	// Path, when set, is the PATH a bare Prog is looked up on (a spawn's
	// "path" info key); "" = the ranks' own PATH.
	Path string `json:"path,omitempty"`
}

// Resolve finds the App's program as a node starts it: a path with a
// slash relative to its working directory (Wdir, else the job's wdir), a
// bare name on its Path, else on the PATH its ranks get (env, the job's
// environment, with the App's own Env over it). A working directory that
// is not one here is an error too: the ranks could not start in it (a
// spawn's wdir info key is checked only here).
func (a *App) Resolve(wdir string, env []string) (string, error) {
	if wd := a.workDir(wdir); wd != "" {
		if st, err := os.Stat(wd); err != nil || !st.IsDir() {
			return "", fmt.Errorf("working directory %s is not a directory here", wd)
		}
	}
	if len(a.Env) > 0 {
		env = append(slices.Clone(env), a.Env...) // as startRank builds it: the App's last
	}
	if a.Path != "" {
		env = setEnv(slices.Clone(env), "PATH", a.Path)
	}
	return lookProg(a.Prog, a.workDir(wdir), env)
}

// workDir is where the App's ranks start in a job whose wdir is wdir.
func (a *App) workDir(wdir string) string {
	switch {
	case a.Wdir == "":
		return wdir
	case filepath.IsAbs(a.Wdir) || wdir == "":
		return a.Wdir
	}
	return filepath.Join(wdir, a.Wdir)
}

// App returns the index of the App that runs global rank r.
func (s *Spec) App(r int) int {
	for i, a := range s.Apps {
		if r < a.Size {
			return i
		}
		r -= a.Size
	}
	return -1
}

// MaxRanks bounds a job's size.
const MaxRanks = 1 << 20

// DefaultVirtualRounds is the number of timed rounds of a virtual
// workload when Spec.VirtualRounds is 0.
const DefaultVirtualRounds = 10

// bindUnits are Spec.Bind's and Spec.MapBy's values.
var bindUnits = []string{"core", "hwthread", "socket"}

// VirtualWorkloads are the workloads Spec.Virtual may name (internal/virtual
// plays them; its tests check that it plays exactly these).
var VirtualWorkloads = []string{"allgather", "fence", "iallgather", "ring", "kvs-dense", "kvs-sparse", "kvs-dense-od", "kvs-sparse-od", "kvs-cards",
	"paper-fence", "paper-ifence", "paper-allgather", "paper-iallgather",
	"paper-ifence-sleep", "paper-ifence-spin", "paper-iallgather-sleep", "paper-iallgather-spin",
	"paper-init-fence", "paper-init-allgather", "paper-init-iallgather",
	"pmix-fence"}

// VirtualWorkWorkloads are the workloads of VirtualWorkloads that compute
// for Spec.VirtualWork in every round (and need it set).
var VirtualWorkWorkloads = []string{
	"paper-ifence-sleep", "paper-ifence-spin", "paper-iallgather-sleep", "paper-iallgather-spin",
	"paper-init-fence", "paper-init-allgather", "paper-init-iallgather"}

// MaxVirtualWork bounds Spec.VirtualWork: a round computes at most this
// long, so a benchmark round always ends.
const MaxVirtualWork = time.Minute

// CheckVirtualWork checks the compute work of a virtual workload: set
// (positive, at most MaxVirtualWork) exactly for VirtualWorkWorkloads.
func CheckVirtualWork(workload string, work time.Duration) error {
	needs := slices.Contains(VirtualWorkWorkloads, workload)
	switch {
	case work < 0 || work > MaxVirtualWork:
		return fmt.Errorf("virtual work %v: want 0 to %v", work, MaxVirtualWork)
	case needs && work == 0:
		return fmt.Errorf("virtual workload %q computes in every round: it needs a virtual work duration", workload)
	case !needs && work > 0:
		return fmt.Errorf("virtual work %v: workload %q does no work (want one of %s)", work, workload, strings.Join(VirtualWorkWorkloads, ", "))
	}
	return nil
}

// Validate checks a spec built by the root or read from it. It fills no
// defaults: the root sets every field.
func (s *Spec) Validate() error {
	if s.Size < 1 || s.Size > MaxRanks {
		return fmt.Errorf("job size %d: want 1..%d", s.Size, MaxRanks)
	}
	if s.JobID == "" || len(s.JobID) > pmiwire.KVSNameMax {
		return fmt.Errorf("job id %q: want 1..%d bytes", s.JobID, pmiwire.KVSNameMax)
	}
	if len(s.Nodes) == 0 {
		return errors.New("no nodes")
	}
	seen := make([]bool, s.Size)
	n := 0
	for i, rs := range s.Nodes {
		if len(rs) == 0 {
			return fmt.Errorf("node %d has no ranks", i)
		}
		for _, r := range rs {
			if r < 0 || r >= s.Size || seen[r] {
				return fmt.Errorf("node %d: rank %d out of range or placed twice", i, r)
			}
			seen[r] = true
			n++
		}
	}
	if n != s.Size {
		return fmt.Errorf("%d ranks placed of %d", n, s.Size)
	}
	if s.SpawnerRank < 0 || (s.SpawnerRank > 0 && s.SpawnerJobID == "") {
		return fmt.Errorf("spawner rank %d of job %q", s.SpawnerRank, s.SpawnerJobID)
	}
	if s.Usize < -1 || s.Usize == 0 {
		return fmt.Errorf("universe size %d: want -1 (unlimited) or at least 1", s.Usize)
	}
	if len(s.Apps) == 0 && s.Virtual == "" {
		return errors.New("no program to run")
	}
	sum := 0
	for i, a := range s.Apps {
		if a.Prog == "" && s.Virtual == "" {
			return fmt.Errorf("command %d: no program to run", i)
		}
		if a.Size < 1 {
			return fmt.Errorf("command %d (%s): %d ranks, want at least 1", i, a.Prog, a.Size)
		}
		if err := checkEnv(a.Env); err != nil {
			return fmt.Errorf("command %d (%s): %w", i, a.Prog, err)
		}
		sum += a.Size
	}
	if len(s.Apps) > 0 && sum != s.Size {
		return fmt.Errorf("commands run %d ranks of a job of %d", sum, s.Size)
	}
	if err := checkEnv(s.Env); err != nil {
		return err
	}
	if s.Jobno < 0 {
		return fmt.Errorf("job number %d: want 0 or more", s.Jobno)
	}
	if _, err := agent.ParseKVSPolicy(s.KVS); err != nil {
		return err
	}
	if _, err := ParseStrategy(s.GetStrategy); err != nil {
		return err
	}
	for _, p := range s.Preput {
		if p.Key == "" || len(p.Key) > pmiwire.KeyLenMax || len(p.Val) > pmiwire.ValLenMax {
			return fmt.Errorf("pre-put key %q: want 1..%d bytes and a value of at most %d", p.Key, pmiwire.KeyLenMax, pmiwire.ValLenMax)
		}
	}
	if err := CheckPattern(s.Prefix, "rht"); err != nil {
		return fmt.Errorf("output prefix: %w", err)
	}
	if err := CheckPattern(s.OutPattern+s.ErrPattern, "rh"); err != nil {
		return fmt.Errorf("output file pattern: %w", err)
	}
	if s.Bind != "" && !slices.Contains(bindUnits, s.Bind) || s.MapBy != "" && !slices.Contains(bindUnits, s.MapBy) {
		return fmt.Errorf("binding %q, mapping %q: want core, hwthread or socket", s.Bind, s.MapBy)
	}
	if s.Umask != nil && (*s.Umask < 0 || *s.Umask > 0o777) {
		return fmt.Errorf("umask %#o: want 0 to 0777", *s.Umask)
	}
	if s.TimerSlack < TimerSlackOff || s.TimerSlack > MaxTimerSlack {
		return fmt.Errorf("timer slack %v: want %v (auto), %v (off) or a duration up to %v", s.TimerSlack, TimerSlackAuto, TimerSlackOff, MaxTimerSlack)
	}
	if s.StdinRank < -2 || s.StdinRank >= s.Size || s.StdinRank == -2 && len(s.Nodes) > 1 {
		return fmt.Errorf("stdin rank %d: want 0..%d, -1 (none) or -2 (all, one node)", s.StdinRank, s.Size-1)
	}
	if s.Virtual != "" && !slices.Contains(VirtualWorkloads, s.Virtual) {
		return fmt.Errorf("virtual workload %q: want one of %s", s.Virtual, strings.Join(VirtualWorkloads, ", "))
	}
	if s.VirtualRounds < 0 || s.VirtualLate < 0 {
		return fmt.Errorf("virtual rounds %d, late arrival %v: want 0 or more", s.VirtualRounds, s.VirtualLate)
	}
	if err := CheckVirtualWork(s.Virtual, s.VirtualWork); err != nil {
		return err
	}
	if s.KillGrace <= 0 || s.DisconnectGrace <= 0 {
		return fmt.Errorf("kill grace %v, disconnect grace %v: want more than 0", s.KillGrace, s.DisconnectGrace)
	}
	if len(s.Nodes) > 1 || s.Root != "" {
		if s.TreeWidth < 1 || s.NetTimeout <= 0 || s.Root == "" {
			return fmt.Errorf("multi-node spec: tree width %d, net timeout %v, root %q", s.TreeWidth, s.NetTimeout, s.Root)
		}
	}
	return nil
}

// checkEnv checks KEY=VALUE entries.
func checkEnv(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("environment entry %q: want KEY=VALUE", kv)
		}
	}
	return nil
}

// StdinNode is the node whose ranks read the job's input: the node of
// StdinRank, 0 for all (one node), or -1 for none.
func (s *Spec) StdinNode() int {
	switch {
	case s.StdinRank == -1:
		return -1
	case s.StdinRank < 0:
		return 0
	}
	for i, rs := range s.Nodes {
		if slices.Contains(rs, s.StdinRank) {
			return i
		}
	}
	return -1
}

// Encode returns the spec as the one line an agent reads from its standard
// input.
func (s *Spec) Encode() []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("encode job spec: %v", err)) // only plain fields
	}
	return append(b, '\n')
}

// ReadSpec reads and validates the spec line from an agent's standard
// input; what follows it on br is rank 0's input.
func ReadSpec(br *bufio.Reader) (*Spec, error) {
	line, err := br.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("read job spec: %w", err)
	}
	var s Spec
	if err := DecodeSpec(line, &s); err != nil {
		return nil, fmt.Errorf("read job spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("job spec: %w", err)
	}
	return &s, nil
}

// HostLocalEnv reports whether environment variable k describes the
// machine or login session rather than the job, so that an agent started
// over ssh keeps its own value instead of pmirun's.
func HostLocalEnv(k string) bool {
	return k == "HOSTNAME" || k == "SHLVL" || k == "_" || strings.HasPrefix(k, "SSH_")
}

// launchEnv is the environment the node's ranks start from: the agent's
// own, or pmirun's (LauncherEnv) with this machine's and session's own
// variables kept; PWD follows Wdir.
func (s *Spec) launchEnv() []string {
	own := os.Environ()
	if s.EnvNone {
		from := own
		if len(s.LauncherEnv) > 0 {
			from = s.LauncherEnv
		}
		var env []string
		for _, kv := range from {
			if k, _, _ := strings.Cut(kv, "="); slices.Contains(s.EnvKeep, k) {
				env = append(env, kv)
			}
		}
		return setEnv(env, "PWD", s.Wdir)
	}
	if len(s.LauncherEnv) == 0 {
		return setEnv(own, "PWD", s.Wdir)
	}
	var env []string
	for _, kv := range s.LauncherEnv {
		if k, _, ok := strings.Cut(kv, "="); ok && k != "" && !HostLocalEnv(k) {
			env = append(env, kv)
		}
	}
	for _, kv := range own {
		if k, _, _ := strings.Cut(kv, "="); HostLocalEnv(k) {
			env = append(env, kv)
		}
	}
	return setEnv(env, "PWD", s.Wdir)
}

// setEnv sets k=v in env (v "" leaves env as it is).
func setEnv(env []string, k, v string) []string {
	if v == "" {
		return env
	}
	out := env[:0:0]
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name != k {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}

// dedupEnv returns env without the earlier of two variables of one name
// (--env over the launcher's environment, a rank's own over both), in
// the order of the ones kept, as os/exec passes an environment.
func dedupEnv(env []string) []string {
	out := make([]string, 0, len(env))
	seen := make(map[string]bool, len(env))
	for i := len(env) - 1; i >= 0; i-- {
		k, _, _ := strings.Cut(env[i], "=")
		if !seen[k] {
			seen[k] = true
			out = append(out, env[i])
		}
	}
	slices.Reverse(out)
	return out
}

// getEnv returns k's value in env.
func getEnv(env []string, k string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if name, v, _ := strings.Cut(env[i], "="); name == k {
			return v
		}
	}
	return ""
}

var errNoProgram = errors.New("no program")

// lookProg resolves the program once for every rank: a path with a slash
// relative to wdir, a bare name on env's PATH (the ranks' own, not the
// agent's).
func lookProg(prog, wdir string, env []string) (string, error) {
	if prog == "" {
		return "", errNoProgram
	}
	if strings.Contains(prog, "/") {
		p := prog
		if !filepath.IsAbs(p) && wdir != "" {
			p = filepath.Join(wdir, p)
		}
		return p, executable(p)
	}
	path := getEnv(env, "PATH")
	if path == "" {
		path = os.Getenv("PATH") // -genvnone: the agent's own
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) && wdir != "" {
			dir = filepath.Join(wdir, dir)
		}
		p := filepath.Join(dir, prog)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w in $PATH", ErrNotFound) // the caller names prog
}

// ErrNotFound and ErrCannotExecute say why a program cannot run: shells
// exit 127 for the first and 126 for the second (ExitCodeFor).
var (
	ErrNotFound      = errors.New("executable file not found")
	ErrCannotExecute = errors.New("cannot execute")
)

// cannotExecute is why a found file cannot run; it is ErrCannotExecute.
type cannotExecute string

func (e cannotExecute) Error() string        { return string(e) }
func (e cannotExecute) Is(target error) bool { return target == ErrCannotExecute }

var (
	_ error = cannotExecute("")
)

// ExitCodeFor is the shell's exit code for a program that could not be
// started because of err: 127 not found, 126 found but not executable
// (permissions, a directory, an exec format error), else 1.
func ExitCodeFor(err error) int {
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return 127
	case errors.Is(err, ErrCannotExecute), errors.Is(err, fs.ErrPermission), sys.IsExecFormat(err):
		return 126
	}
	return 1
}

// shellPath is the shell that runs a script without "#!".
const shellPath = "/bin/sh"

// shellScript reports whether the file at p, which the kernel refused
// to execute (ENOEXEC), is a script for the shell: text, with no control
// character but white space in its first bytes (an ELF of another
// machine, or any other binary, is not).
func shellScript(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 256)
	k, _ := io.ReadFull(f, head)
	for _, c := range head[:k] {
		if (c < ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') || c == 0x7f {
			return false
		}
	}
	return true
}

// interpreter is the interpreter a "#!" line at the start of the file at
// p names ("/bin/sh\r" for a script with DOS line ends), or "".
func interpreter(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, _ := bufio.NewReader(io.LimitReader(f, 256)).ReadString('\n')
	rest, ok := strings.CutPrefix(line, "#!")
	if !ok {
		return ""
	}
	if w := strings.FieldsFunc(rest, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' }); len(w) > 0 {
		return w[0]
	}
	return ""
}

// executable reports why p cannot be run, or nil.
func executable(p string) error {
	st, err := os.Stat(p)
	switch {
	case err != nil:
		return err
	case st.IsDir():
		return cannotExecute(p + ": is a directory")
	case st.Mode()&0o111 == 0:
		return cannotExecute(p + ": permission denied")
	}
	return nil
}
