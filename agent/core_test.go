package agent

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// Golden conversation scripts (testdata/*.txt), in the style of
// cockroachdb/datadriven as etcd-io/raft uses it: each block is a
// directive with arguments, optional input lines, a "----" line and the
// expected output, ended by a blank line. Lines starting with # between
// blocks are comments. `go test ./agent -run Golden -update` rewrites the
// expected output.
//
// Directives:
//
//	new size=N [local=a,b,c] [ring=off,size] [late=k,k] [kvs=P]   a fresh Core
//	step                                       one op per input line; prints the Ready
//	auto on|off                                complete Upstream calls as Local does
//
// Op lines: put L key val [sparse|dense], get L key [wait] [src=R], jobattr L key
// [kvs], nodeput L key val, nodeget L key [wait], fence L [epoch],
// allgather L val, barrier L group [m,m,..], ring L left right [count],
// publish L name port, unpublish L name, lookup L name, abort L code msg,
// finalize L, gone L why, init L, spoke L, fencedone E [err],
// agdone E [err], edgedone E left|right value [err], namedone ID [port]
// [err=...], shutdown, setattr key val; from other nodes: serveget ID key
// [wait] [final], placekv owner key val, fetchdone ID [found=V] [err=...].
// L is a local index. Requests are numbered #1, #2,
// ... in the order of the script.

var update = flag.Bool("update", false, "rewrite testdata/*.txt with the actual output")

// script drives one Core.
type script struct {
	c    *Core
	size int
	n    uint64 // requests issued
	auto bool   // answer Upstream calls like Local
	emu  localEmu
}

func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

func runScript(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var s script
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	line := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		line++
		return sc.Text(), true
	}
	for {
		l, ok := next()
		if !ok {
			break
		}
		if l == "" || strings.HasPrefix(l, "#") {
			out.WriteString(l + "\n")
			continue
		}
		directive, start := l, line
		var input []string
		for {
			l, ok = next()
			if !ok {
				t.Fatalf("%s:%d: block without ----", path, start)
			}
			if l == "----" {
				break
			}
			input = append(input, l)
		}
		var want []string
		for {
			l, ok = next()
			if !ok || l == "" {
				break
			}
			want = append(want, l)
		}
		got := s.run(t, directive, input)
		out.WriteString(directive + "\n")
		for _, in := range input {
			out.WriteString(in + "\n")
		}
		out.WriteString("----\n")
		if got != "" {
			out.WriteString(got)
		}
		if ok {
			out.WriteString("\n")
		}
		if w := strings.Join(want, "\n"); !*update && strings.TrimSpace(w) != strings.TrimSpace(got) {
			t.Errorf("%s:%d: %s\n got:\n%s\nwant:\n%s", path, start, directive, got, w)
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *script) run(t *testing.T, directive string, input []string) string {
	f := strings.Fields(directive)
	args := map[string]string{}
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	switch f[0] {
	case "new":
		size := atoi(t, args["size"])
		cfg := Config{JobID: "job", Size: size, Mapping: "(vector,(0,1," + args["size"] + "))"}
		if l, ok := args["local"]; ok {
			for _, x := range strings.Split(l, ",") {
				cfg.Local = append(cfg.Local, atoi(t, x))
			}
		} else {
			for i := range size {
				cfg.Local = append(cfg.Local, i)
			}
		}
		if l, ok := args["late"]; ok {
			cfg.LateAttrs = map[string]func(){}
			for _, k := range strings.Split(l, ",") {
				cfg.LateAttrs[k] = func() {}
			}
		}
		off, rsize := 0, len(cfg.Local)
		if r, ok := args["ring"]; ok {
			o, z, _ := strings.Cut(r, ",")
			off, rsize = atoi(t, o), atoi(t, z)
		}
		if k, ok := args["kvs"]; ok {
			p, err := ParseKVSPolicy(k)
			if err != nil {
				t.Fatal(err)
			}
			cfg.KVS = p
		}
		if err := cfg.validate(); err != nil {
			t.Fatal(err)
		}
		*s = script{c: NewCore(&cfg, off, rsize), size: size, auto: size == len(cfg.Local)}
		s.emu = newLocalEmu(len(cfg.Local))
		return ""
	case "auto":
		s.auto = len(f) > 1 && f[1] == "on"
		return ""
	case "step":
		var out strings.Builder
		for _, in := range input {
			op, err := s.parse(in)
			if err != nil {
				t.Fatalf("%q: %v", in, err)
			}
			if err := s.c.Step(op); err != nil {
				fmt.Fprintf(&out, "error: %v\n", err)
			}
		}
		s.drain(&out)
		return out.String()
	}
	t.Fatalf("unknown directive %q", f[0])
	return ""
}

// drain prints the Ready batches, feeding the Upstream's answers back in
// auto mode until nothing is left to do.
func (s *script) drain(out *strings.Builder) {
	for {
		rd := s.c.Ready()
		if rd.Empty() {
			return
		}
		out.WriteString(formatReady(&rd))
		if !s.auto {
			return
		}
		ops := s.emu.answer(rd.Upstream)
		if len(ops) == 0 {
			return
		}
		for _, op := range ops {
			if err := s.c.Step(op); err != nil {
				fmt.Fprintf(out, "error: %v\n", err)
			}
		}
		out.WriteString("~~ upstream answered\n")
	}
}

// localEmu answers Upstream calls as Local does for a single-node job.
type localEmu struct {
	n     int
	names map[string]string
	edges map[uint64]*[2]*UpCall
}

func newLocalEmu(n int) localEmu {
	return localEmu{n: n, names: map[string]string{}, edges: map[uint64]*[2]*UpCall{}}
}

func (e *localEmu) answer(calls []UpCall) []Op {
	var ops []Op
	for i := range calls {
		u := &calls[i]
		switch u.Kind {
		case UpFence:
			ops = append(ops, FenceDone{Epoch: u.Epoch, KVs: u.KVs})
		case UpAllgather:
			all := make([][]byte, 0, len(u.Values))
			for _, rv := range u.Values {
				for len(all) <= int(rv.Rank) {
					all = append(all, nil)
				}
				all[rv.Rank] = rv.Value
			}
			ops = append(ops, AllgatherDone{Epoch: u.Epoch, Values: all})
		case UpRingEdge:
			p := e.edges[u.Epoch]
			if p == nil {
				p = new([2]*UpCall)
				e.edges[u.Epoch] = p
			}
			side := 0
			if !u.ToLeft {
				side = 1
			}
			p[side] = u
			if p[0] != nil && p[1] != nil {
				delete(e.edges, u.Epoch)
				ops = append(ops, RingEdgeDone{Epoch: u.Epoch, ToLeft: true, Value: p[1].Value},
					RingEdgeDone{Epoch: u.Epoch, ToLeft: false, Value: p[0].Value})
			}
		case UpPublish:
			if _, dup := e.names[u.Name]; dup {
				ops = append(ops, NameDone{ID: u.ID, Err: fmt.Errorf("publish %q: %w", u.Name, ErrNameExists)})
			} else {
				e.names[u.Name] = u.Port
				ops = append(ops, NameDone{ID: u.ID})
			}
		case UpUnpublish:
			if _, ok := e.names[u.Name]; !ok {
				ops = append(ops, NameDone{ID: u.ID, Err: fmt.Errorf("unpublish %q: %w", u.Name, ErrNameNotFound)})
			} else {
				delete(e.names, u.Name)
				ops = append(ops, NameDone{ID: u.ID})
			}
		case UpLookup:
			if p, ok := e.names[u.Name]; ok {
				ops = append(ops, NameDone{ID: u.ID, Port: p})
			} else {
				ops = append(ops, NameDone{ID: u.ID, Err: fmt.Errorf("lookup %q: %w", u.Name, ErrNameNotFound)})
			}
		}
	}
	return ops
}

func (s *script) req() Req { s.n++; return Req{Via: ViaTest, ID: s.n} }

func (s *script) parse(line string) (Op, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil, fmt.Errorf("empty op")
	}
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	num := func(i int) int {
		n, _ := strconv.Atoi(arg(i))
		return n
	}
	has := func(w string) bool {
		for _, x := range f[1:] {
			if x == w {
				return true
			}
		}
		return false
	}
	errArg := func() error {
		for _, x := range f[1:] {
			if v, ok := strings.CutPrefix(x, "err="); ok {
				return fmt.Errorf("%s", strings.ReplaceAll(v, "_", " "))
			}
		}
		return nil
	}
	L := num(1)
	switch f[0] {
	case "spoke":
		return Spoke{L}, nil
	case "init":
		return Init{L}, nil
	case "put":
		h := pmiwire.HintNone
		if has("sparse") {
			h = pmiwire.HintSparse
		} else if has("dense") {
			h = pmiwire.HintDense
		}
		return Put{Local: L, Req: s.req(), Key: arg(2), Val: arg(3), Hint: h}, nil
	case "get":
		src := -1
		for _, x := range f[3:] {
			if v, ok := strings.CutPrefix(x, "src="); ok {
				src, _ = strconv.Atoi(v)
			}
		}
		return Get{Local: L, Req: s.req(), Key: arg(2), Wait: has("wait"), Src: src}, nil
	case "serveget": // serveget ID KEY [wait] [final]
		return ServeGet{ID: uint64(L), Key: arg(2), Src: -1, Wait: has("wait"), Final: has("final")}, nil
	case "placekv": // placekv OWNER KEY VAL
		return PlaceKV{Owner: L, Key: arg(2), Val: arg(3)}, nil
	case "fetchdone": // fetchdone ID found=V | notfound | err=E
		o := FetchDone{ID: uint64(L), Err: errArg()}
		if v, ok := strings.CutPrefix(arg(2), "found="); ok {
			o.Found, o.Val = true, v
		}
		return o, nil
	case "jobattr":
		return JobAttr{Local: L, Req: s.req(), Key: arg(2), KVS: has("kvs")}, nil
	case "nodeput":
		return PutNodeAttr{Local: L, Req: s.req(), Key: arg(2), Val: arg(3)}, nil
	case "nodeget":
		return GetNodeAttr{Local: L, Req: s.req(), Key: arg(2), Wait: has("wait")}, nil
	case "fence": // fence L [EPOCH] [detached]
		return Fence{Local: L, Req: s.req(), Epoch: uint64(num(2)), Detached: has("detached")}, nil
	case "allgather": // allgather L VALUE [detached]
		return Allgather{Local: L, Req: s.req(), Value: []byte(arg(2)), Detached: has("detached")}, nil
	case "block": // block L UNTIL|all
		if arg(2) == "all" {
			return Block{Local: L, Until: BlockAll}, nil
		}
		return Block{Local: L, Until: uint64(num(2))}, nil
	case "barrier":
		var m []int
		if arg(3) != "" {
			for _, x := range strings.Split(arg(3), ",") {
				n, _ := strconv.Atoi(x)
				m = append(m, n)
			}
		}
		return Barrier{Local: L, Req: s.req(), Group: arg(2), Members: m}, nil
	case "ring":
		count := 1
		if arg(4) != "" {
			count = num(4)
		}
		return Ring{Local: L, Req: s.req(), In: RingIn{Count: count, Left: arg(2), Right: arg(3)}}, nil
	case "publish":
		return Name{Local: L, Req: s.req(), Op: NamePublish, Name: arg(2), Port: arg(3)}, nil
	case "unpublish":
		return Name{Local: L, Req: s.req(), Op: NameUnpublish, Name: arg(2)}, nil
	case "lookup":
		return Name{Local: L, Req: s.req(), Op: NameLookup, Name: arg(2)}, nil
	case "abort":
		return Abort{Local: L, Code: num(2), Msg: arg(3)}, nil
	case "finalize":
		return Finalize{Local: L, Req: s.req()}, nil
	case "gone":
		return Gone{Local: L, Why: strings.Join(f[2:], " ")}, nil
	case "fencedone":
		var kvs []KV
		for _, x := range f[2:] {
			if k, v, ok := strings.Cut(x, "="); ok && k != "err" {
				kvs = append(kvs, KV{Key: k, Val: v})
			}
		}
		return FenceDone{Epoch: uint64(L), KVs: kvs, Err: errArg()}, nil
	case "agdone":
		var vals [][]byte
		for _, x := range f[2:] {
			if !strings.HasPrefix(x, "err=") {
				vals = append(vals, []byte(x))
			}
		}
		return AllgatherDone{Epoch: uint64(L), Values: vals, Err: errArg()}, nil
	case "edgedone":
		return RingEdgeDone{Epoch: uint64(L), ToLeft: arg(2) == "left", Value: arg(3), Err: errArg()}, nil
	case "namedone":
		port := arg(2)
		if strings.HasPrefix(port, "err=") {
			port = ""
		}
		return NameDone{ID: uint64(L), Port: port, Err: errArg()}, nil
	case "shutdown":
		return Shutdown{}, nil
	case "setattr":
		return SetJobAttr{Key: f[1], Val: f[2]}, nil
	}
	return nil, fmt.Errorf("unknown op %q", f[0])
}

// formatReady prints a Ready batch, one line per item, in its order.
func formatReady(rd *Ready) string {
	var b strings.Builder
	if len(rd.Marks) > 0 {
		b.WriteString("marks:")
		for _, m := range rd.Marks {
			fmt.Fprintf(&b, " %s@%d", strings.ReplaceAll(m.Phase, " ", "-"), m.Rank)
		}
		b.WriteString("\n")
	}
	for _, r := range rd.Replies {
		b.WriteString(formatReply(&r) + "\n")
	}
	for _, r := range rd.Results {
		fmt.Fprintf(&b, "result epoch=%d", r.Epoch)
		if r.Allgather {
			fmt.Fprintf(&b, " allgather values=%s", formatValues(r.Values))
		} else {
			fmt.Fprintf(&b, " fence kvs=%s", formatKVs(r.KVs))
		}
		if r.Err != nil {
			fmt.Fprintf(&b, " err=%q", r.Err.Error())
		}
		b.WriteString("\n")
	}
	for _, e := range rd.Events {
		switch e.Kind {
		case EventInit:
			fmt.Fprintf(&b, "event init rank=%d\n", e.Rank)
		case EventFinalized:
			fmt.Fprintf(&b, "event finalized rank=%d\n", e.Rank)
		case EventAbort:
			fmt.Fprintf(&b, "event abort rank=%d code=%d msg=%q\n", e.Rank, e.Code, e.Msg)
		}
	}
	for _, u := range rd.Upstream {
		fmt.Fprintf(&b, "upstream %s", u.Kind)
		switch u.Kind {
		case UpFence:
			fmt.Fprintf(&b, " epoch=%d kvs=%s", u.Epoch, formatKVs(u.KVs))
		case UpAllgather:
			fmt.Fprintf(&b, " epoch=%d values=[", u.Epoch)
			for i, rv := range u.Values {
				if i > 0 {
					b.WriteString(" ")
				}
				fmt.Fprintf(&b, "%d:%s", rv.Rank, rv.Value)
			}
			b.WriteString("]")
		case UpRingEdge:
			side := "right"
			if u.ToLeft {
				side = "left"
			}
			fmt.Fprintf(&b, " epoch=%d %s value=%s", u.Epoch, side, u.Value)
		case UpPlace:
			fmt.Fprintf(&b, " key=%s val=%s owner=%d", u.Name, u.Port, u.Owner)
		case UpFetch:
			fmt.Fprintf(&b, " id=%d key=%s src=%d wait=%v", u.ID, u.Name, u.Src, u.Wait)
		case UpAnswer:
			fmt.Fprintf(&b, " id=%d found=%v val=%s", u.ID, u.Found, u.Port)
			if u.Err != nil {
				fmt.Fprintf(&b, " err=%q", u.Err.Error())
			}
		default:
			fmt.Fprintf(&b, " id=%d name=%s", u.ID, u.Name)
			if u.Kind == UpPublish {
				fmt.Fprintf(&b, " port=%s", u.Port)
			}
		}
		b.WriteString("\n")
	}
	for _, k := range rd.Wants {
		fmt.Fprintf(&b, "want %s\n", k)
	}
	return b.String()
}

func formatReply(r *Reply) string {
	var b strings.Builder
	fmt.Fprintf(&b, "reply L%d #%d %s", r.Local, r.Req.ID, r.Kind)
	if r.Err != nil {
		fmt.Fprintf(&b, " err=%q", r.Err.Error())
	}
	switch r.Kind {
	case ReplyGet, ReplyJobAttr, ReplyGetNodeAttr:
		if r.Err == nil {
			if r.Found {
				fmt.Fprintf(&b, " found=%s", r.Val)
			} else {
				b.WriteString(" not-found")
			}
		}
	case ReplyName:
		if r.Val != "" {
			fmt.Fprintf(&b, " port=%s", r.Val)
		}
	case ReplyFence:
		fmt.Fprintf(&b, " epoch=%d", r.Epoch)
	case ReplyAllgather:
		fmt.Fprintf(&b, " epoch=%d", r.Epoch)
		if r.Err == nil {
			fmt.Fprintf(&b, " values=%s", formatValues(r.Values))
		}
	case ReplyRing:
		if r.Err == nil {
			fmt.Fprintf(&b, " pos=%d/%d left=%s right=%s", r.Ring.Pos, r.Ring.Size, r.Ring.Left, r.Ring.Right)
		}
	}
	return b.String()
}

func formatKVs(kvs []KV) string {
	var b strings.Builder
	b.WriteString("[")
	for i, kv := range kvs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%s@%d", kv.Key, kv.Val, kv.Owner)
	}
	b.WriteString("]")
	return b.String()
}

func formatValues(vs [][]byte) string {
	var b strings.Builder
	b.WriteString("[")
	for i, v := range vs {
		if i > 0 {
			b.WriteString(" ")
		}
		b.Write(v)
	}
	b.WriteString("]")
	return b.String()
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("bad number %q", s)
	}
	return n
}
