// Package cli parses pmirun's command line into a launch.Config and
// writes its help, man page and bash completion, all from one table of
// options (Flags), so they cannot drift apart.
//
// The spellings are those of Hydra's mpiexec (single dash: -n, -np,
// -hosts, -genv K V, -wdir, -bind-to) and of srun where common (--ntasks,
// --chdir, --label, --input); every option takes one or two leading
// dashes, and a value either as the next argument or after "=". An option
// given twice under any of its names is an error, except those that add
// (--env, -genv). Parsing stops at the program name (or "--"), so the
// program's own flags pass through untouched.
//
// The parser checks only what a value's spelling says (a number, a
// duration, one of a set of words); the job's consistency is checked by
// launch.Config's validation, the one place every caller goes through.
package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/launch"
)

// ErrHelp is returned when the user asked for --help, ErrVersion for
// --version: the caller prints them on stdout and exits 0.
var (
	ErrHelp    = errors.New("help requested")
	ErrVersion = errors.New("version requested")
)

// parser holds one parse's state.
type parser struct {
	cfg     launch.Config
	seen    map[*Flag]string // flag → the spelling first used
	envFrom string           // -genvall, -genvnone or -genvlist, once
	// firstEnv is Hydra's local -env K V (one dash) before the first
	// program: the first command's variables, as a segment's -env.
	firstEnv []string
	// configFile is -configfile's file: the commands, one a line.
	configFile string
}

// lookup maps every spelling without its dashes to its flag.
var lookup = func() map[string]*Flag {
	m := make(map[string]*Flag)
	for _, f := range flagTable {
		for _, n := range f.Names {
			k := strings.TrimLeft(n, "-")
			if m[k] != nil {
				panic("cli: option " + n + " defined twice")
			}
			m[k] = f
		}
	}
	return m
}()

// Parse parses pmirun's arguments (without the program name). It returns
// ErrHelp or ErrVersion when asked for them; any other error is one line
// that names the option.
func Parse(args []string) (launch.Config, error) {
	p := &parser{seen: make(map[*Flag]string)}
	p.cfg.UniverseSize = -1
	i := 0
	for i < len(args) {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if a == ":" {
			return p.cfg, errors.New(`":" before any program: an MPMD segment is "[-n N] [-env K V] [-wdir DIR] program [args]"`)
		}
		if len(a) < 2 || a[0] != '-' {
			break // the program
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		name, inline, hasInline := strings.Cut(name, "=")
		if name == "env" && !strings.HasPrefix(a, "--") {
			// Hydra's -env K V: a local option, the first command's
			// (--env K=V is every rank's).
			kv, next, err := envArg(args, i+1, inline, hasInline)
			if err != nil {
				return p.cfg, err
			}
			p.firstEnv = append(p.firstEnv, kv)
			i = next
			continue
		}
		f := lookup[name]
		if f == nil {
			return p.cfg, fmt.Errorf("unknown option %s", a)
		}
		spelled := a
		if hasInline {
			spelled = a[:len(a)-len(inline)-1]
		}
		if first, dup := p.seen[f]; dup && !f.Repeat {
			if first == spelled {
				return p.cfg, fmt.Errorf("option %s given twice", spelled)
			}
			return p.cfg, fmt.Errorf("option %s given twice (as %s and %s)", f.Names[0], first, spelled)
		}
		p.seen[f] = spelled
		i++
		var vals []string
		switch {
		case f.Nargs == 0 && hasInline:
			return p.cfg, fmt.Errorf("option %s takes no value", spelled)
		case f.Nargs == 0:
		case hasInline:
			vals = append(vals, inline)
		}
		need := f.Nargs - len(vals)
		if f.Nargs == 2 && len(vals) == 0 && i < len(args) && strings.Contains(args[i], "=") {
			// -genv KEY=VALUE: one word, as --env takes it.
			k, v, _ := strings.Cut(args[i], "=")
			vals, need = []string{k, v}, 0
			i++
		}
		if f.Nargs == 2 && len(vals) == 1 {
			k, v, ok := strings.Cut(vals[0], "=")
			if !ok {
				return p.cfg, fmt.Errorf("option %s wants %s", spelled, f.Arg)
			}
			vals, need = []string{k, v}, 0
		}
		if i+need > len(args) {
			return p.cfg, fmt.Errorf("option %s needs a value (%s)", spelled, f.Arg)
		}
		vals = append(vals, args[i:i+need]...)
		i += need
		if err := f.set(p, vals); err != nil {
			if errors.Is(err, ErrHelp) || errors.Is(err, ErrVersion) {
				return p.cfg, err
			}
			if len(vals) == 0 { // a switch: nothing invalid but its use
				return p.cfg, fmt.Errorf("%s: %w", spelled, err)
			}
			return p.cfg, fmt.Errorf("invalid %s %s: %w", spelled, strings.Join(vals, " "), err)
		}
	}
	if err := p.envTimeout(); err != nil {
		return p.cfg, err
	}
	rest := args[i:]
	if p.configFile != "" {
		if len(rest) > 0 {
			return p.cfg, fmt.Errorf("-configfile %s names the commands: no program may follow (%s)", p.configFile, rest[0])
		}
		if _, set := p.seen[lookup["n"]]; set {
			return p.cfg, errors.New("-configfile gives each command its -n: the run's -n is not used")
		}
		if len(p.firstEnv) > 0 {
			return p.cfg, errors.New("-configfile gives each command its -env: use -genv or --env for every rank")
		}
		return p.cfg, p.readConfigFile()
	}
	if len(rest) == 0 {
		return p.cfg, errors.New("no program given")
	}
	end := slices.Index(rest, ":")
	if end < 0 {
		p.cfg.Prog, p.cfg.Args = rest[0], rest[1:]
		p.cfg.Env = append(p.cfg.Env, p.firstEnv...) // after -genv's: -env wins
		return p.cfg, nil
	}
	// MPMD: "prog args : [-n N] [-env K V] [-wdir DIR] prog args : ...";
	// the options before the first program are the run's, its -n and
	// -env the first command's.
	apps := []node.App{{Prog: rest[0], Args: rest[1:end], Size: max(p.cfg.Size, 1), Env: p.firstEnv}}
	for rest = rest[end+1:]; ; {
		app, next, err := parseSegment(rest)
		if err != nil {
			return p.cfg, fmt.Errorf("MPMD command %d: %w", len(apps), err)
		}
		apps = append(apps, app)
		if next == nil {
			break
		}
		rest = next
	}
	p.cfg.Size = 0
	for _, a := range apps {
		p.cfg.Size += a.Size
	}
	p.cfg.Apps = apps
	return p.cfg, nil
}

// timeoutEnv is Hydra's variable for the job's time limit, in seconds.
// Scripts written for mpiexec (MPICH's test suite among them) set it to
// end a job that hangs.
const timeoutEnv = "MPIEXEC_TIMEOUT"

// envTimeout takes the job's time limit from MPIEXEC_TIMEOUT when
// --timeout is not given, as mpiexec does; set and empty means none.
func (p *parser) envTimeout() error {
	if _, set := p.seen[lookup["timeout"]]; set {
		return nil
	}
	v := os.Getenv(timeoutEnv)
	if v == "" {
		return nil
	}
	if err := duration(v, 0, &p.cfg.Timeout); err != nil {
		return fmt.Errorf("invalid %s=%s in the environment: %w", timeoutEnv, v, err)
	}
	return nil
}

// readConfigFile sets the run's commands from -configfile: one MPMD
// segment a line, its words split at white space.
func (p *parser) readConfigFile() error {
	b, err := os.ReadFile(p.configFile)
	if err != nil {
		return fmt.Errorf("-configfile: %w", err)
	}
	var apps []node.App
	for n, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		app, next, err := parseSegment(words)
		if err == nil && next != nil {
			err = errors.New(`one command a line: ":" is not needed`)
		}
		if err != nil {
			return fmt.Errorf("-configfile %s line %d: %w", p.configFile, n+1, err)
		}
		apps = append(apps, app)
	}
	if len(apps) == 0 {
		return fmt.Errorf("-configfile %s names no command", p.configFile)
	}
	p.cfg.Size = 0
	for _, a := range apps {
		p.cfg.Size += a.Size
	}
	p.cfg.Apps = apps
	return nil
}

// parseSegment parses one MPMD segment after a ":" — its own options,
// program and arguments — and returns what follows its closing ":" (nil
// if it is the last).
func parseSegment(args []string) (node.App, []string, error) {
	app := node.App{Size: 1}
	seen := map[string]bool{}
	i := 0
	for ; i < len(args) && len(args[i]) > 1 && args[i][0] == '-'; i++ {
		name, inline, hasInline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if name == "np" {
			name = "n"
		}
		if seen[name] && name != "env" {
			return app, nil, fmt.Errorf("option %s given twice", args[i])
		}
		seen[name] = true
		val := func() (string, error) {
			if hasInline {
				return inline, nil
			}
			if i+1 >= len(args) || args[i+1] == ":" {
				return "", fmt.Errorf("option %s needs a value", args[i])
			}
			i++
			return args[i], nil
		}
		switch name {
		case "n":
			v, err := val()
			if err != nil {
				return app, nil, err
			}
			if app.Size, err = strconv.Atoi(v); err != nil || app.Size < 1 {
				return app, nil, fmt.Errorf("invalid -n %q: want a number of ranks of at least 1", v)
			}
		case "env":
			kv, next, err := envArg(args, i+1, inline, hasInline)
			if err != nil {
				return app, nil, err
			}
			app.Env = append(app.Env, kv)
			i = next - 1
		case "wdir", "chdir":
			v, err := val()
			if err != nil {
				return app, nil, err
			}
			app.Wdir = v
		default:
			return app, nil, fmt.Errorf("unknown option %s (a segment after \":\" takes -n, -env and -wdir; the others are the run's, before the first program)", args[i])
		}
	}
	if i == len(args) || args[i] == ":" {
		return app, nil, errors.New("no program")
	}
	app.Prog = args[i]
	rest := args[i+1:]
	end := slices.Index(rest, ":")
	if end < 0 {
		app.Args = rest
		return app, nil, nil
	}
	app.Args = rest[:end]
	if end+1 == len(rest) {
		return app, nil, errors.New(`a ":" ends the command line: another command must follow it`)
	}
	return app, rest[end+1:], nil
}

// envArg reads the value of a command's -env, whose values start at
// args[i] (inline is the value given after "="): KEY VALUE, as Hydra
// spells it, or KEY=VALUE. It returns KEY=VALUE and the index after it.
func envArg(args []string, i int, inline string, hasInline bool) (string, int, error) {
	v := inline
	if !hasInline {
		if i >= len(args) || args[i] == ":" {
			return "", i, errors.New("option -env needs a value (KEY VALUE)")
		}
		v = args[i]
		i++
	}
	if !strings.Contains(v, "=") {
		if i >= len(args) || args[i] == ":" {
			return "", i, fmt.Errorf("option -env %s needs a value", v)
		}
		v += "=" + args[i]
		i++
	}
	if k, _, _ := strings.Cut(v, "="); k == "" {
		return "", i, fmt.Errorf("invalid -env %q: want KEY VALUE or KEY=VALUE", v)
	}
	return v, i, nil
}

// addHosts appends hosts, each HOST or HOST:SLOTS; an IPv6 address is
// HOST as it is (fd00::2) or in brackets ([fd00::2], [fd00::2]:4), as
// ssh and URLs write it.
func (p *parser) addHosts(hs []string) error {
	for _, h := range hs {
		name, slots, err := splitHost(h)
		if err != nil {
			if h == "" {
				return fmt.Errorf("empty host name in %q", strings.Join(hs, ","))
			}
			return err
		}
		p.cfg.Hosts = append(p.cfg.Hosts, name)
		p.cfg.Slots = append(p.cfg.Slots, slots)
	}
	return nil
}

// splitHost splits HOST[:SLOTS] into the host and its slots (0 when
// unsaid), blanks around it dropped. A name that starts with '-' is refused: ssh would take it for
// one of its options (-oProxyCommand=... runs a command here).
func splitHost(h string) (string, int, error) {
	h = strings.TrimSpace(h) // -hosts "a, b"
	name, slots, hasSlots := strings.Cut(h, ":")
	switch {
	case strings.HasPrefix(h, "["):
		addr, rest, ok := strings.Cut(h[1:], "]")
		if !ok || net.ParseIP(stripZone(addr)) == nil || (rest != "" && !strings.HasPrefix(rest, ":")) {
			return "", 0, fmt.Errorf("host %q: want [IPV6ADDRESS] or [IPV6ADDRESS]:SLOTS", h)
		}
		name, slots, hasSlots = addr, strings.TrimPrefix(rest, ":"), rest != ""
	case strings.Count(h, ":") > 1:
		// An IPv6 address without brackets has no slots: the last
		// group of fd00::1:4 is the address's.
		if net.ParseIP(stripZone(h)) == nil {
			return "", 0, fmt.Errorf("host %q: want HOST or HOST:SLOTS (an IPv6 address with slots in brackets: [ADDRESS]:SLOTS)", h)
		}
		name, slots, hasSlots = h, "", false
	}
	if name == "" {
		return "", 0, fmt.Errorf("empty host name in %q", h)
	}
	if strings.HasPrefix(name, "-") {
		return "", 0, fmt.Errorf("host %q: a host name cannot start with '-' (ssh would take it for an option)", name)
	}
	if !agent.HostOK(name) {
		return "", 0, fmt.Errorf("host %q: a host name holds no blanks, control characters, commas or semicolons", name)
	}
	n := 0
	if hasSlots {
		var err error
		if n, err = strconv.Atoi(slots); err != nil || n < 1 {
			return "", 0, fmt.Errorf("host %q: want HOST or HOST:SLOTS with SLOTS at least 1", h)
		}
	}
	return name, n, nil
}

// stripZone drops an IPv6 address's zone (fe80::1%eth0), which ParseIP
// does not take.
func stripZone(addr string) string {
	a, _, _ := strings.Cut(addr, "%")
	return a
}

// addEnv adds one KEY=VALUE for every rank.
func (p *parser) addEnv(kv string) error {
	if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", kv)
	}
	p.cfg.Env = append(p.cfg.Env, kv)
	return nil
}

// envMode records which of -genvall, -genvnone, -genvlist was given:
// -genvall excludes the other two.
func (p *parser) envMode(mode string) error {
	if p.envFrom != "" && p.envFrom != mode && (p.envFrom == "-genvall" || mode == "-genvall") {
		return fmt.Errorf("excludes %s", p.envFrom)
	}
	if p.envFrom == "" || mode == "-genvall" {
		p.envFrom = mode
	}
	if mode == "-genvnone" || mode == "-genvlist" {
		p.cfg.EnvNone = true
	}
	return nil
}

// Usage writes pmirun's --help: synopsis, options by group, examples and
// the exit codes.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: pmirun [options] program [args...]\n\n")
	fmt.Fprint(w, "Run program as an MPI job of -n ranks and serve their PMI. Options take one or\ntwo dashes and a value as the next argument or after \"=\"; they end at the\nprogram name (or \"--\").\n")
	for _, g := range Groups {
		fmt.Fprintf(w, "\n%s:\n", groupTitle(g))
		for _, f := range flagTable {
			if f.Group != g {
				continue
			}
			head := "  " + spellings(f)
			lines := wrap(f.Help, 80-helpIndent)
			if len(head) >= helpIndent {
				fmt.Fprintf(w, "%s\n%*s%s\n", head, helpIndent, "", lines[0])
			} else {
				fmt.Fprintf(w, "%-*s%s\n", helpIndent, head, lines[0])
			}
			for _, l := range lines[1:] {
				fmt.Fprintf(w, "%*s%s\n", helpIndent, "", l)
			}
		}
	}
	fmt.Fprint(w, "\nexamples:\n")
	for _, e := range Examples {
		fmt.Fprintf(w, "  %s\n%*s%s\n", e.Cmd, helpIndent, "", e.What)
	}
	fmt.Fprint(w, "\nexit codes:\n")
	for _, e := range ExitCodes {
		fmt.Fprintf(w, "  %-9s %s\n", e.Code, e.What)
	}
}

// helpIndent is the column where --help's descriptions start.
const helpIndent = 28

// wrap breaks s into lines of at most width bytes at spaces (a longer
// word gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

// spellings is a flag's names with its value, as help shows them.
func spellings(f *Flag) string {
	s := strings.Join(f.Names, ", ")
	if f.Arg != "" {
		s += " " + f.Arg
	}
	return s
}

func groupTitle(g string) string { return strings.ToUpper(g[:1]) + g[1:] }

// Example is one line of the examples in --help and the man page.
type Example struct{ Cmd, What string }

// Examples are shown by --help and the man page.
var Examples = []Example{
	{"pmirun -n 4 ./app", "4 ranks on this machine"},
	{"pmirun -n 8 -l --timeout 60 ./app arg", "labelled output, end after 60 s"},
	{"pmirun -n 4 -bind-to core ./app", "one core per rank"},
	{"pmirun -n 16 -hosts n1,n2 ./app", "two nodes over ssh, 8 ranks each"},
	{"pmirun -n 16 -f hosts.txt -ppn 4 ./app", "nodes from a file, 4 ranks per node"},
	{"pmirun -n 2 -genv OMP_NUM_THREADS 4 ./app", "set a variable in every rank"},
	{"pmirun -n 4 -outfile-pattern out.%r ./app", "each rank's stdout to out.0..out.3"},
}

// ExitCode is one row of the exit-code table.
type ExitCode struct{ Code, What string }

// ExitCodes are pmirun's exit codes (--help, the man page).
var ExitCodes = []ExitCode{
	{"0", "every rank succeeded"},
	{"N", "the first failing rank's exit code, or the MPI_Abort code"},
	{"128+S", "the first failing rank was killed by signal S"},
	{"1", "the job failed otherwise (a node lost, a PMI protocol error)"},
	{"2", "bad command line or job description"},
	{"124", "--timeout ended the job"},
	{"126", "the program was found but cannot be executed"},
	{"127", "the program was not found"},
}
