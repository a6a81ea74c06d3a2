package pmiwire

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// spawnFromTrace returns the spawn request recorded in a trace file.
func spawnFromTrace(t *testing.T, file string) Msg {
	t.Helper()
	for _, conv := range readTrace(t, "testdata/traces/"+file) {
		for _, tm := range conv {
			if !tm.Sent || !strings.Contains(tm.Text, "spawn") {
				continue
			}
			res, err := decodeStream([]byte(wire(tm)), 1)
			if err != nil || len(res) != 1 || res[0].Err != nil {
				t.Fatalf("line %d: %v %v", tm.Line, res, err)
			}
			return res[0].Msg
		}
	}
	t.Fatalf("%s: no spawn request", file)
	return Msg{}
}

// TestParseSpawnTraces parses the spawn requests MPICH 4.3.2 sent to Hydra
// in both framings (MPI_Comm_spawn of 2 processes of ./spawn_test with
// arguments "child tagA 0" and the parent's port as preput).
func TestParseSpawnTraces(t *testing.T) {
	want := func(port string) *Spawn {
		return &Spawn{
			Cmds: []SpawnCmd{{Exe: "./spawn_test", MaxProcs: 2, Args: []string{"child", "tagA", "0"}}},
			Preput: []Pair{{Key: "PARENT_ROOT_PORT_NAME",
				Val: "tag#0$description#vm$port#" + port + "$ifname#127.0.0.1$"}},
		}
	}
	for _, tc := range []struct {
		file, port string
		framing    Framing
	}{
		{"mpich432-spawn-pmi1-hydra432.txt", "57323", V1},
		{"mpich432-spawn-pmi2-hydra432.txt", "57977", V2},
	} {
		m := spawnFromTrace(t, tc.file)
		if m.Framing != tc.framing || m.Cmd != "spawn" {
			t.Fatalf("%s: decoded %v %q", tc.file, m.Framing, m.Cmd)
		}
		sp, err := ParseSpawn(&m)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if !reflect.DeepEqual(sp, want(tc.port)) {
			t.Fatalf("%s:\ngot  %+v\nwant %+v", tc.file, sp, want(tc.port))
		}
	}
}

// decodeOne decodes a single request, failing the test otherwise.
func decodeOne(t *testing.T, wire string) Msg {
	t.Helper()
	res, err := decodeStream([]byte(wire), 3)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("%q: %v %v", wire, res, err)
	}
	return res[0].Msg
}

// segment writes one PMI-1 spawn segment from its lines.
func segment(lines ...string) string {
	return "mcmd=spawn\n" + strings.Join(lines, "\n") + "\nendcmd\n"
}

func TestParseSpawnMultiCommand(t *testing.T) {
	want := &Spawn{
		Cmds: []SpawnCmd{
			{Exe: "/bin/a", MaxProcs: 2, Args: []string{"-x", "two words", "k=v"},
				Info: []Pair{{Key: "wdir", Val: "/tmp"}, {Key: "host", Val: "n1,n2"}}},
			{Exe: "/bin/b", MaxProcs: 1},
		},
		Preput: []Pair{{Key: "PARENT_ROOT_PORT_NAME", Val: "tag#0$port#1$"}, {Key: "k2", Val: ""}},
	}
	cases := []struct{ name, wire string }{
		{"v1 MPICH order", segment("nprocs=2", "execname=/bin/a", "totspawns=2", "spawnssofar=1", "argcnt=3",
			"arg1=-x", "arg2=two words", "arg3=k=v", "preput_num=2", "preput_key_0=PARENT_ROOT_PORT_NAME",
			"preput_val_0=tag#0$port#1$", "preput_key_1=k2", "preput_val_1=", "info_num=2", "info_key_0=wdir",
			"info_val_0=/tmp", "info_key_1=host", "info_val_1=n1,n2") +
			segment("nprocs=1", "execname=/bin/b", "totspawns=2", "spawnssofar=2", "argcnt=0", "info_num=0")},
		// Older MPICH: argcnt after the arguments and the preput pairs
		// repeated in every segment; info_num absent when there is none.
		{"v1 old MPICH order", segment("nprocs=2", "execname=/bin/a", "totspawns=2", "spawnssofar=1", "arg1=-x",
			"arg2=two words", "arg3=k=v", "argcnt=3", "preput_num=2", "preput_key_0=PARENT_ROOT_PORT_NAME",
			"preput_val_0=tag#0$port#1$", "preput_key_1=k2", "preput_val_1=", "info_num=2", "info_key_0=wdir",
			"info_val_0=/tmp", "info_key_1=host", "info_val_1=n1,n2") +
			segment("nprocs=1", "execname=/bin/b", "totspawns=2", "spawnssofar=2", "argcnt=0", "preput_num=2",
				"preput_key_0=PARENT_ROOT_PORT_NAME", "preput_val_0=tag#0$port#1$", "preput_key_1=k2", "preput_val_1=")},
		{"v1 shuffled with CRLF", strings.ReplaceAll(segment("info_val_1=n1,n2", "argcnt=3", "execname=/bin/a", "arg3=k=v",
			"info_key_1=host", "totspawns=2", "preput_key_1=k2", "arg1=-x", "spawnssofar=1", "info_num=2", "info_key_0=wdir",
			"preput_val_1=", "nprocs=2", "arg2=two words", "preput_num=2", "info_val_0=/tmp",
			"preput_key_0=PARENT_ROOT_PORT_NAME", "preput_val_0=tag#0$port#1$"), "\n", "\r\n") +
			segment("spawnssofar=2", "totspawns=2", "argcnt=0", "nprocs=1", "execname=/bin/b")},
		{"v2 MPICH order", frameV2("cmd=spawn;ncmds=2;preputcount=2;ppkey0=PARENT_ROOT_PORT_NAME;ppval0=tag#0$port#1$;"+
			"ppkey1=k2;ppval1=;subcmd=/bin/a;maxprocs=2;argc=3;argv0=-x;argv1=two words;argv2=k=v;infokeycount=2;"+
			"infokey0=wdir;infoval0=/tmp;infokey1=host;infoval1=n1,n2;subcmd=/bin/b;maxprocs=1;argc=0;infokeycount=0;", false)},
		{"v2 no infokeycount, thrid last", frameV2("cmd=spawn;ncmds=2;preputcount=2;ppkey0=PARENT_ROOT_PORT_NAME;ppval0=tag#0$port#1$;"+
			"ppkey1=k2;ppval1=;subcmd=/bin/a;maxprocs=2;argc=3;argv0=-x;argv1=two words;argv2=k=v;infokeycount=2;"+
			"infokey0=wdir;infoval0=/tmp;infokey1=host;infoval1=n1,n2;subcmd=/bin/b;maxprocs=1;argc=0;thrid=0x1234;", true)},
		{"v2 shuffled inside groups", frameV2("cmd=spawn;thrid=0x1;ppval1=;preputcount=2;ppkey1=k2;ncmds=2;ppval0=tag#0$port#1$;"+
			"ppkey0=PARENT_ROOT_PORT_NAME;subcmd=/bin/a;infoval1=n1,n2;argv2=k=v;argc=3;infokey1=host;argv0=-x;"+
			"maxprocs=2;infokeycount=2;infokey0=wdir;argv1=two words;infoval0=/tmp;subcmd=/bin/b;argc=0;maxprocs=1;", false)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := decodeOne(t, tc.wire)
			sp, err := ParseSpawn(&m)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sp, want) {
				t.Fatalf("got  %+v\nwant %+v", sp, want)
			}
		})
	}
}

func TestParseSpawnErrors(t *testing.T) {
	okSeg := func(tot, sofar int, extra ...string) []string {
		return append([]string{"nprocs=1", "execname=a", fmt.Sprint("totspawns=", tot), fmt.Sprint("spawnssofar=", sofar), "argcnt=0"}, extra...)
	}
	without := func(lines []string, key string) []string {
		var out []string
		for _, l := range lines {
			if !strings.HasPrefix(l, key+"=") {
				out = append(out, l)
			}
		}
		return out
	}
	v1 := func(segs ...[]string) Msg {
		m := Msg{Framing: V1, Cmd: "spawn"}
		for _, s := range segs {
			m.Segments = append(m.Segments, pairs(s...))
		}
		return m
	}
	const (
		head  = "cmd=spawn;ncmds=1;preputcount=0;"
		group = "subcmd=a;maxprocs=1;argc=0;"
	)
	v2 := func(body string) Msg {
		m, err := parseV2Body([]byte(body))
		if err != nil {
			panic(err)
		}
		return m
	}
	cases := []struct {
		name   string
		m      Msg
		reason string
	}{
		{"not spawn", Msg{Framing: V2, Cmd: "kvs-put"}, "not a spawn request"},
		{"v1 no segments", Msg{Framing: V1, Cmd: "spawn"}, "no mcmd=spawn segments"},
		{"v1 missing nprocs", v1(without(okSeg(1, 1), "nprocs")), "segment 1: missing nprocs"},
		{"v1 nprocs zero", v1(append(without(okSeg(1, 1), "nprocs"), "nprocs=0")), "nprocs=0, want at least 1"},
		{"v1 nprocs not a number", v1(append(without(okSeg(1, 1), "nprocs"), "nprocs=two")), `nprocs="two" is not a number`},
		{"v1 nprocs twice", v1(append(okSeg(1, 1), "nprocs=3")), "nprocs given more than once"},
		{"v1 missing execname", v1(without(okSeg(1, 1), "execname")), "missing or empty execname"},
		{"v1 empty execname", v1(append(without(okSeg(1, 1), "execname"), "execname=")), "missing or empty execname"},
		{"v1 bare execname", v1(append(without(okSeg(1, 1), "execname"), "execname")), "missing or empty execname"},
		{"v1 missing argcnt", v1(without(okSeg(1, 1), "argcnt")), "missing argcnt"},
		{"v1 negative argcnt", v1(append(without(okSeg(1, 1), "argcnt"), "argcnt=-1")), "argcnt=-1 is negative"},
		{"v1 fewer args", v1(append(without(okSeg(1, 1), "argcnt"), "argcnt=2", "arg1=x")), "argcnt=2 but arg2 is missing"},
		{"v1 more args", v1(okSeg(1, 1, "arg1=x")), "arg1 is outside argcnt=0"},
		{"v1 arg0", v1(append(without(okSeg(1, 1), "argcnt"), "argcnt=1", "arg0=x", "arg1=y")), "arg0 is outside argcnt=1"},
		{"v1 huge argcnt", v1(append(without(okSeg(1, 1), "argcnt"), "argcnt=2000000000")), "only 5 fields follow"},
		{"v1 arg index with leading zero", v1(append(without(okSeg(1, 1), "argcnt"), "argcnt=1", "arg01=x")), "bad index in field arg01"},
		{"v1 totspawns mismatch", v1(okSeg(2, 2)), "totspawns=2 but the block has 1 segments"},
		{"v1 spawnssofar out of order", v1(okSeg(2, 2), okSeg(2, 1)), "segment 1: spawnssofar=2, want 1"},
		{"v1 missing totspawns", v1(without(okSeg(1, 1), "totspawns")), "missing totspawns"},
		{"v1 preput count short", v1(okSeg(1, 1, "preput_num=1", "preput_key_0=k")), "preput_num=1 but preput_val_0 is missing"},
		{"v1 preput without count", v1(okSeg(1, 1, "preput_key_0=k", "preput_val_0=v")), "preput_key_0 is outside preput_num=0"},
		{"v1 preput empty key", v1(okSeg(1, 1, "preput_num=1", "preput_key_0=", "preput_val_0=v")), "preput_key_0 is empty"},
		{"v1 preput differs", v1(okSeg(2, 1, "preput_num=1", "preput_key_0=k", "preput_val_0=v"),
			okSeg(2, 2, "preput_num=1", "preput_key_0=k", "preput_val_0=w")), "segment 2: preput pairs differ"},
		{"v1 info negative", v1(okSeg(1, 1, "info_num=-1")), "info_num=-1 is negative"},
		{"v1 info too many", v1(okSeg(1, 1, "info_num=1", "info_key_0=a", "info_val_0=b", "info_key_1=c")), "info_key_1 is outside info_num=1"},
		{"v2 missing ncmds", v2("cmd=spawn;preputcount=0;" + group), "header: missing ncmds"},
		{"v2 ncmds not a number", v2("cmd=spawn;ncmds=one;preputcount=0;" + group), `ncmds="one" is not a number`},
		{"v2 ncmds negative", v2("cmd=spawn;ncmds=-1;preputcount=0;" + group), "ncmds=-1 is negative"},
		{"v2 ncmds zero", v2("cmd=spawn;ncmds=0;preputcount=0;"), "ncmds=0, want at least 1"},
		{"v2 fewer groups", v2("cmd=spawn;ncmds=2;preputcount=0;" + group), "ncmds=2 but the request has 1 subcmd groups"},
		{"v2 more groups", v2(head + group + group), "ncmds=1 but the request has 2 subcmd groups"},
		{"v2 missing preputcount", v2("cmd=spawn;ncmds=1;" + group), "header: missing preputcount"},
		{"v2 preput short", v2("cmd=spawn;ncmds=1;preputcount=2;ppkey0=a;ppval0=b;ppkey1=c;" + group), "preputcount=2 but ppval1 is missing"},
		{"v2 preput beyond count", v2("cmd=spawn;ncmds=1;preputcount=0;ppkey0=a;ppval0=b;" + group), "ppkey0 is outside preputcount=0"},
		{"v2 preput in a group", v2("cmd=spawn;ncmds=1;preputcount=1;" + group + "ppkey0=a;ppval0=b;"), "preputcount=1 but ppkey0 is missing"},
		{"v2 huge preputcount", v2("cmd=spawn;ncmds=1;preputcount=999999999;" + group), "only 2 fields follow"},
		{"v2 empty subcmd", v2(head + "subcmd=;maxprocs=1;argc=0;"), "command 1: missing or empty subcmd"},
		{"v2 missing maxprocs", v2(head + "subcmd=a;argc=0;"), "command 1: missing maxprocs"},
		{"v2 maxprocs zero", v2(head + "subcmd=a;maxprocs=0;argc=0;"), "maxprocs=0, want at least 1"},
		{"v2 maxprocs negative", v2(head + "subcmd=a;maxprocs=-4;argc=0;"), "maxprocs=-4 is negative"},
		{"v2 maxprocs overflow", v2(head + "subcmd=a;maxprocs=99999999999999999999;argc=0;"), "is not a number"},
		{"v2 maxprocs twice", v2(head + "subcmd=a;maxprocs=1;maxprocs=2;argc=0;"), "maxprocs given more than once"},
		{"v2 missing argc", v2(head + "subcmd=a;maxprocs=1;"), "missing argc"},
		{"v2 fewer argv", v2(head + "subcmd=a;maxprocs=1;argc=2;argv0=x;"), "argc=2 but argv1 is missing"},
		{"v2 more argv", v2(head + "subcmd=a;maxprocs=1;argc=1;argv0=x;argv1=y;"), "argv1 is outside argc=1"},
		{"v2 argv 1-based", v2(head + "subcmd=a;maxprocs=1;argc=1;argv1=x;"), "argv1 is outside argc=1"},
		{"v2 argv twice", v2(head + "subcmd=a;maxprocs=1;argc=1;argv0=x;argv0=y;"), "argv0 given more than once"},
		{"v2 second group bad", v2("cmd=spawn;ncmds=2;preputcount=0;" + group + "subcmd=b;maxprocs=1;argc=1;"), "command 2: argc=1 but argv0 is missing"},
		{"v2 info without count", v2(head + group + "infokey0=a;infoval0=b;"), "infokey0 is outside infokeycount=0"},
		{"v2 info short", v2(head + group + "infokeycount=1;infokey0=a;"), "infokeycount=1 but infoval0 is missing"},
		{"v2 info not a number", v2(head + group + "infokeycount=x;"), `infokeycount="x" is not a number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sp, err := ParseSpawn(&tc.m)
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("got %+v, %v; want a *SyntaxError", sp, err)
			}
			if !strings.Contains(se.Reason, tc.reason) {
				t.Fatalf("reason %q, want ~%q", se.Reason, tc.reason)
			}
			if sp != nil {
				t.Fatalf("got a Spawn with the error: %+v", sp)
			}
			if tc.m.Cmd == "spawn" && (se.Cmd != "spawn" || se.Framing != tc.m.Framing) {
				t.Fatalf("error names %v %q", se.Framing, se.Cmd)
			}
		})
	}
}

// randSpawn draws a valid spawn request. v1Safe keeps values to what a
// PMI-1 line can carry (no LF, no trailing CR).
func randSpawn(rng *rand.Rand, v1Safe bool) *Spawn {
	alpha := v2ValAlphabet
	if v1Safe {
		alpha = v1ValAlphabet + " \t;"
	}
	val := func(minLen int) string { return randString(rng, alpha, minLen, 30) }
	sp := &Spawn{}
	for range rng.IntN(3) {
		sp.Preput = append(sp.Preput, Pair{Key: val(1), Val: val(0)})
	}
	for range 1 + rng.IntN(3) {
		c := SpawnCmd{Exe: val(1), MaxProcs: 1 + rng.IntN(1000)}
		for range rng.IntN(12) {
			c.Args = append(c.Args, val(0))
		}
		for range rng.IntN(3) {
			c.Info = append(c.Info, Pair{Key: val(1), Val: val(0)})
		}
		sp.Cmds = append(sp.Cmds, c)
	}
	return sp
}

// TestSpawnRoundTrip is the spawn property: a random request, encoded in
// either framing and decoded in random chunks, parses back equal.
func TestSpawnRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for iter := 0; iter < 300; iter++ {
		for _, f := range []Framing{V1, V2} {
			sp := randSpawn(rng, f == V1)
			var wire []byte
			if f == V1 {
				wire = AppendSpawnV1(nil, sp)
			} else {
				wire = AppendSpawnV2(nil, sp)
			}
			res, err := decodeStream(wire, 1+rng.IntN(30), 1+rng.IntN(5))
			if err != nil || len(res) != 1 || res[0].Err != nil {
				t.Fatalf("iteration %d %v: %v %v\n%q", iter, f, res, err, wire)
			}
			got, err := ParseSpawn(&res[0].Msg)
			if err != nil {
				t.Fatalf("iteration %d %v: %v\n%q", iter, f, err, wire)
			}
			if !reflect.DeepEqual(got, sp) {
				t.Fatalf("iteration %d %v:\ngot  %+v\nwant %+v\n%q", iter, f, got, sp, wire)
			}
		}
	}
}

// TestAppendSpawnV1KeepsFraming checks that values a PMI-1 line cannot
// carry are replaced rather than breaking the block.
func TestAppendSpawnV1KeepsFraming(t *testing.T) {
	sp := &Spawn{Cmds: []SpawnCmd{{Exe: "a\nb", MaxProcs: 1, Args: []string{"x\r", "endcmd"}}}}
	m := decodeOne(t, string(AppendSpawnV1(nil, sp)))
	got, err := ParseSpawn(&m)
	if err != nil {
		t.Fatal(err)
	}
	want := &Spawn{Cmds: []SpawnCmd{{Exe: "a_b", MaxProcs: 1, Args: []string{"x_", "endcmd"}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v want %+v", got, want)
	}
}
