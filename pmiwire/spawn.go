package pmiwire

import (
	"fmt"
	"strconv"
	"strings"
)

// Spawn is a parsed spawn request (PMI-1 "mcmd=spawn" block or PMI-2
// "cmd=spawn"), independent of framing.
type Spawn struct {
	Cmds   []SpawnCmd
	Preput []Pair // key/value pairs stored in the children's KVS
}

// SpawnCmd is one executable of a spawn request.
type SpawnCmd struct {
	Exe      string
	MaxProcs int
	Args     []string // argv[1:], in order
	Info     []Pair   // info keys (host, wdir, path, ...)
	// Env holds "NAME=value" variables for the children of this command.
	// The text protocols carry none (ParseSpawn leaves it empty); a PMIx
	// spawn does (pmix_app_t's env: Open MPI passes the parent's port
	// and MCA parameters there).
	Env []string
}

// ParseSpawn turns a decoded spawn request of either framing into a Spawn,
// checking every count against the fields present: a count that is missing,
// not a number or negative, entries missing or beyond the announced count,
// a duplicated field, maxprocs/nprocs below 1 or an empty executable give a
// *SyntaxError with Cmd "spawn" whose reason names the command and field.
// Fields the request does not need are ignored (thrid, for one).
//
// PMI-1: each segment of Msg.Segments describes one command (nprocs,
// execname, totspawns, spawnssofar, argcnt, arg1..argN, optional info_num
// with info_key_i/info_val_i, 0-based); totspawns must equal the number of
// segments and spawnssofar the segment's position. The preput pairs
// (preput_num, preput_key_i/preput_val_i) come from the first segment;
// a later segment may repeat the same set (older MPICH clients send it in
// every segment) but not another one.
//
// PMI-2: ncmds and preputcount with ppkey_i/ppval_i come first, then one
// group per command starting at its "subcmd" field: maxprocs, argc,
// argv0..argv(argc-1), optional infokeycount with infokey_i/infoval_i.
// Groups are told apart by position, since their keys repeat; inside the
// header and inside a group the order of the fields does not matter.
func ParseSpawn(m *Msg) (*Spawn, error) {
	if m.Cmd != "spawn" {
		return nil, &SyntaxError{Framing: m.Framing, Cmd: m.Cmd, Reason: "not a spawn request"}
	}
	if m.Framing == V2 {
		return parseSpawnV2(m)
	}
	return parseSpawnV1(m)
}

func parseSpawnV1(m *Msg) (*Spawn, error) {
	if len(m.Segments) == 0 {
		return nil, spawnErr(V1, "no mcmd=spawn segments")
	}
	sp := &Spawn{Cmds: make([]SpawnCmd, 0, len(m.Segments))}
	for i, seg := range m.Segments {
		f := newFieldSet(V1, fmt.Sprintf("segment %d", i+1), seg)
		total, err := f.count("totspawns", true)
		if err != nil {
			return nil, err
		}
		if total != len(m.Segments) {
			return nil, f.errf("totspawns=%d but the block has %d segments", total, len(m.Segments))
		}
		sofar, err := f.count("spawnssofar", true)
		if err != nil {
			return nil, err
		}
		if sofar != i+1 {
			return nil, f.errf("spawnssofar=%d, want %d", sofar, i+1)
		}
		var c SpawnCmd
		if c.Exe, err = f.exe("execname"); err != nil {
			return nil, err
		}
		if c.MaxProcs, err = f.procs("nprocs"); err != nil {
			return nil, err
		}
		if c.Args, err = f.list("argcnt", true, "arg", 1); err != nil {
			return nil, err
		}
		if c.Info, err = f.pairs("info_num", false, "info_key_", "info_val_"); err != nil {
			return nil, err
		}
		pre, err := f.pairs("preput_num", false, "preput_key_", "preput_val_")
		if err != nil {
			return nil, err
		}
		if i == 0 {
			sp.Preput = pre
		} else if len(pre) > 0 && !equalPairs(pre, sp.Preput) {
			return nil, f.errf("preput pairs differ from those of segment 1")
		}
		sp.Cmds = append(sp.Cmds, c)
	}
	return sp, nil
}

func parseSpawnV2(m *Msg) (*Spawn, error) {
	// The header runs up to the first subcmd; each group from a subcmd to
	// the next. starts[g] is the index in m.Pairs of group g's subcmd.
	var starts []int
	for i, p := range m.Pairs {
		if p.Key == "subcmd" {
			starts = append(starts, i)
		}
	}
	end := len(m.Pairs)
	if len(starts) > 0 {
		end = starts[0]
	}
	head := newFieldSet(V2, "header", m.Pairs[:end])
	ncmds, err := head.count("ncmds", true)
	if err != nil {
		return nil, err
	}
	if ncmds < 1 {
		return nil, head.errf("ncmds=%d, want at least 1", ncmds)
	}
	if ncmds != len(starts) {
		return nil, head.errf("ncmds=%d but the request has %d subcmd groups", ncmds, len(starts))
	}
	sp := &Spawn{Cmds: make([]SpawnCmd, 0, len(starts))}
	if sp.Preput, err = head.pairs("preputcount", true, "ppkey", "ppval"); err != nil {
		return nil, err
	}
	for g, start := range starts {
		end := len(m.Pairs)
		if g+1 < len(starts) {
			end = starts[g+1]
		}
		f := newFieldSet(V2, fmt.Sprintf("command %d", g+1), m.Pairs[start:end])
		var c SpawnCmd
		if c.Exe, err = f.exe("subcmd"); err != nil {
			return nil, err
		}
		if c.MaxProcs, err = f.procs("maxprocs"); err != nil {
			return nil, err
		}
		if c.Args, err = f.list("argc", true, "argv", 0); err != nil {
			return nil, err
		}
		if c.Info, err = f.pairs("infokeycount", false, "infokey", "infoval"); err != nil {
			return nil, err
		}
		sp.Cmds = append(sp.Cmds, c)
	}
	return sp, nil
}

func spawnErr(f Framing, reason string) error {
	return &SyntaxError{Framing: f, Cmd: "spawn", Reason: reason}
}

// fieldSet indexes the fields of one spawn segment (PMI-1) or one header
// or command group (PMI-2) by key. A key given twice is an error only if it
// is read.
type fieldSet struct {
	framing Framing
	where   string // "segment 2", "command 1", "header": prefixes errors
	fields  []Pair
	vals    map[string]string
	dup     map[string]bool
}

func newFieldSet(f Framing, where string, pairs []Pair) *fieldSet {
	fs := &fieldSet{framing: f, where: where, fields: pairs, vals: make(map[string]string, len(pairs))}
	for _, p := range pairs {
		if p.NoVal {
			continue
		}
		if _, ok := fs.vals[p.Key]; ok {
			if fs.dup == nil {
				fs.dup = make(map[string]bool)
			}
			fs.dup[p.Key] = true
		}
		fs.vals[p.Key] = p.Val
	}
	return fs
}

func (f *fieldSet) errf(format string, args ...any) error {
	return spawnErr(f.framing, f.where+": "+fmt.Sprintf(format, args...))
}

// get returns the value of key; ok is false if it is absent.
func (f *fieldSet) get(key string) (val string, ok bool, err error) {
	if f.dup[key] {
		return "", false, f.errf("%s given more than once", key)
	}
	val, ok = f.vals[key]
	return val, ok, nil
}

// count reads a non-negative decimal count. An absent optional count is 0.
func (f *fieldSet) count(key string, required bool) (int, error) {
	v, ok, err := f.get(key)
	if err != nil {
		return 0, err
	}
	if !ok {
		if required {
			return 0, f.errf("missing %s", key)
		}
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, f.errf("%s=%q is not a number", key, v)
	}
	if n < 0 {
		return 0, f.errf("%s=%d is negative", key, n)
	}
	return n, nil
}

// procs reads a process count, which must be at least 1.
func (f *fieldSet) procs(key string) (int, error) {
	n, err := f.count(key, true)
	if err != nil {
		return 0, err
	}
	if n < 1 {
		return 0, f.errf("%s=%d, want at least 1", key, n)
	}
	return n, nil
}

// exe reads the executable name, which must not be empty.
func (f *fieldSet) exe(key string) (string, error) {
	v, ok, err := f.get(key)
	if err != nil {
		return "", err
	}
	if !ok || v == "" {
		return "", f.errf("missing or empty %s", key)
	}
	return v, nil
}

// list reads the count in countKey and the values of prefix<base> ..
// prefix<base+count-1>. Every field named prefix<digits> must be in range.
func (f *fieldSet) list(countKey string, required bool, prefix string, base int) ([]string, error) {
	n, err := f.count(countKey, required)
	if err != nil {
		return nil, err
	}
	// Check the fields actually present before trusting n, so that a huge
	// count allocates nothing.
	for _, p := range f.fields {
		idx, ok, err := f.index(p.Key, prefix)
		if err != nil {
			return nil, err
		}
		if ok && (idx < base || idx >= base+n) {
			return nil, f.errf("%s is outside %s=%d", p.Key, countKey, n)
		}
	}
	if n > len(f.fields) {
		return nil, f.errf("%s=%d but only %d fields follow", countKey, n, len(f.fields))
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]string, n)
	for i := range out {
		key := prefix + strconv.Itoa(base+i)
		v, ok, err := f.get(key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, f.errf("%s=%d but %s is missing", countKey, n, key)
		}
		out[i] = v
	}
	return out, nil
}

// pairs reads the count in countKey and the 0-based key/value lists under
// keyPrefix and valPrefix. Keys must not be empty.
func (f *fieldSet) pairs(countKey string, required bool, keyPrefix, valPrefix string) ([]Pair, error) {
	keys, err := f.list(countKey, required, keyPrefix, 0)
	if err != nil {
		return nil, err
	}
	vals, err := f.list(countKey, required, valPrefix, 0)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, nil
	}
	out := make([]Pair, len(keys))
	for i, k := range keys {
		if k == "" {
			return nil, f.errf("%s%d is empty", keyPrefix, i)
		}
		out[i] = Pair{Key: k, Val: vals[i]}
	}
	return out, nil
}

// index reports whether key is prefix followed by a decimal index, and the
// index. Digits with a leading zero or too many of them are an error; a key
// with prefix followed by anything else (e.g. "argcnt" for prefix "arg") is
// another field.
func (f *fieldSet) index(key, prefix string) (int, bool, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || rest == "" {
		return 0, false, nil
	}
	for i := 0; i < len(rest); i++ {
		if rest[i] < '0' || rest[i] > '9' {
			return 0, false, nil
		}
	}
	n, err := strconv.Atoi(rest)
	if err != nil || (rest[0] == '0' && len(rest) > 1) {
		return 0, false, f.errf("bad index in field %s", key)
	}
	return n, true, nil
}

func equalPairs(a, b []Pair) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// AppendSpawnV1 formats s as a PMI-1 spawn block: one "mcmd=spawn" ...
// "endcmd" segment per command, fields in the order MPICH's client writes
// them, the preput pairs in the first segment. Values run to the end of
// their line, so an LF in a value (and a CR ending it) is replaced by '_'.
// Used by test clients.
func AppendSpawnV1(dst []byte, s *Spawn) []byte {
	line := func(key string, val string) {
		dst = append(dst, key...)
		dst = append(dst, '=')
		end := len(strings.TrimRight(val, "\r")) // the decoder drops trailing CRs
		for i := 0; i < len(val); i++ {
			c := val[i]
			if c == '\n' || i >= end {
				c = '_'
			}
			dst = append(dst, c)
		}
		dst = append(dst, '\n')
	}
	num := func(key string, n int) { line(key, strconv.Itoa(n)) }
	for i, c := range s.Cmds {
		dst = append(dst, "mcmd=spawn\n"...)
		num("nprocs", c.MaxProcs)
		line("execname", c.Exe)
		num("totspawns", len(s.Cmds))
		num("spawnssofar", i+1)
		num("argcnt", len(c.Args))
		for j, a := range c.Args {
			line("arg"+strconv.Itoa(j+1), a)
		}
		if i == 0 {
			num("preput_num", len(s.Preput))
			for j, p := range s.Preput {
				line("preput_key_"+strconv.Itoa(j), p.Key)
				line("preput_val_"+strconv.Itoa(j), p.Val)
			}
		}
		num("info_num", len(c.Info))
		for j, p := range c.Info {
			line("info_key_"+strconv.Itoa(j), p.Key)
			line("info_val_"+strconv.Itoa(j), p.Val)
		}
		dst = append(dst, "endcmd\n"...)
	}
	return dst
}

// AppendSpawnV2 formats s as a PMI-2 spawn request frame (PairsV2) with
// a right-aligned header.
func AppendSpawnV2(dst []byte, s *Spawn) []byte {
	return AppendRequestV2(dst, "spawn", s.PairsV2()...)
}

// PairsV2 returns the fields of s as a PMI-2 spawn request, in the order
// MPICH's and Slurm's clients write them (Slurm's server parses them in
// that order).
func (s *Spawn) PairsV2() []Pair {
	pairs := make([]Pair, 0, 2+2*len(s.Preput)+5*len(s.Cmds))
	add := func(k, v string) { pairs = append(pairs, Pair{Key: k, Val: v}) }
	add("ncmds", strconv.Itoa(len(s.Cmds)))
	add("preputcount", strconv.Itoa(len(s.Preput)))
	for i, p := range s.Preput {
		add("ppkey"+strconv.Itoa(i), p.Key)
		add("ppval"+strconv.Itoa(i), p.Val)
	}
	for _, c := range s.Cmds {
		add("subcmd", c.Exe)
		add("maxprocs", strconv.Itoa(c.MaxProcs))
		add("argc", strconv.Itoa(len(c.Args)))
		for i, a := range c.Args {
			add("argv"+strconv.Itoa(i), a)
		}
		add("infokeycount", strconv.Itoa(len(c.Info)))
		for i, p := range c.Info {
			add("infokey"+strconv.Itoa(i), p.Key)
			add("infoval"+strconv.Itoa(i), p.Val)
		}
	}
	return pairs
}
