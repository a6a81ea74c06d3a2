package pmiwire

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// v1Cases covers every PMI-1 request form of pmi-wire.md §3-§4 and §8.
var v1Cases = []struct {
	name, line string
	want       Msg
}{
	{"init 1.1", "cmd=init pmi_version=1 pmi_subversion=1",
		Msg{Framing: V1, Cmd: "init", Pairs: pairs("pmi_version=1", "pmi_subversion=1")}},
	{"init 1.2", "cmd=init pmi_version=1 pmi_subversion=2",
		Msg{Framing: V1, Cmd: "init", Pairs: pairs("pmi_version=1", "pmi_subversion=2")}},
	{"init 2.0", "cmd=init pmi_version=2 pmi_subversion=0",
		Msg{Framing: V1, Cmd: "init", Pairs: pairs("pmi_version=2", "pmi_subversion=0")}},
	{"initack", "cmd=initack pmiid=3", Msg{Framing: V1, Cmd: "initack", Pairs: pairs("pmiid=3")}},
	{"get_maxes", "cmd=get_maxes", Msg{Framing: V1, Cmd: "get_maxes"}},
	{"get_universe_size", "cmd=get_universe_size", Msg{Framing: V1, Cmd: "get_universe_size"}},
	{"get_appnum", "cmd=get_appnum", Msg{Framing: V1, Cmd: "get_appnum"}},
	{"get_my_kvsname", "cmd=get_my_kvsname", Msg{Framing: V1, Cmd: "get_my_kvsname"}},
	{"put", "cmd=put kvsname=kvs_1234_0 key=bc-0 value=abc",
		Msg{Framing: V1, Cmd: "put", Pairs: pairs("kvsname=kvs_1234_0", "key=bc-0", "value=abc")}},
	{"put value with =", "cmd=put kvsname=k key=-bcast-1-0 value=a=b=c",
		Msg{Framing: V1, Cmd: "put", Pairs: pairs("kvsname=k", "key=-bcast-1-0", "value=a=b=c")}},
	{"get", "cmd=get kvsname=kvs_1234_0 key=bc-1",
		Msg{Framing: V1, Cmd: "get", Pairs: pairs("kvsname=kvs_1234_0", "key=bc-1")}},
	{"get empty kvsname", "cmd=get kvsname= key=PMI_process_mapping",
		Msg{Framing: V1, Cmd: "get", Pairs: pairs("kvsname=", "key=PMI_process_mapping")}},
	{"barrier_in 1.1", "cmd=barrier_in", Msg{Framing: V1, Cmd: "barrier_in"}},
	{"barrier_in world", "cmd=barrier_in group=WORLD:12345",
		Msg{Framing: V1, Cmd: "barrier_in", Pairs: pairs("group=WORLD:12345")}},
	{"barrier_in node", "cmd=barrier_in group=NODE:7", Msg{Framing: V1, Cmd: "barrier_in", Pairs: pairs("group=NODE:7")}},
	{"barrier_in ranks", "cmd=barrier_in group=0,1,3:99",
		Msg{Framing: V1, Cmd: "barrier_in", Pairs: pairs("group=0,1,3:99")}},
	{"publish_name", "cmd=publish_name service=example-pubonly-svc port=example-host:4242:size2",
		Msg{Framing: V1, Cmd: "publish_name", Pairs: pairs("service=example-pubonly-svc", "port=example-host:4242:size2")}},
	{"unpublish_name", "cmd=unpublish_name service=svc", Msg{Framing: V1, Cmd: "unpublish_name", Pairs: pairs("service=svc")}},
	{"lookup_name", "cmd=lookup_name service=svc", Msg{Framing: V1, Cmd: "lookup_name", Pairs: pairs("service=svc")}},
	{"finalize", "cmd=finalize", Msg{Framing: V1, Cmd: "finalize"}},
	{"abort mpich", "cmd=abort exitcode=7 message=abort",
		Msg{Framing: V1, Cmd: "abort", Pairs: pairs("exitcode=7", "message=abort")}},
	{"abort without message", "cmd=abort exitcode=7", Msg{Framing: V1, Cmd: "abort", Pairs: pairs("exitcode=7")}},
	{"abort old flux", "cmd=abort exit_code=1 error_msg=boom",
		Msg{Framing: V1, Cmd: "abort", Pairs: pairs("exit_code=1", "error_msg=boom")}},
	{"create_kvs", "cmd=create_kvs", Msg{Framing: V1, Cmd: "create_kvs"}},
	{"destroy_kvs", "cmd=destroy_kvs kvsname=k", Msg{Framing: V1, Cmd: "destroy_kvs", Pairs: pairs("kvsname=k")}},
	{"getbyidx", "cmd=getbyidx kvsname=k idx=0", Msg{Framing: V1, Cmd: "getbyidx", Pairs: pairs("kvsname=k", "idx=0")}},
	{"singinit", "cmd=singinit pmi_version=1 pmi_subversion=1 stdio=yes authtype=none",
		Msg{Framing: V1, Cmd: "singinit", Pairs: pairs("pmi_version=1", "pmi_subversion=1", "stdio=yes", "authtype=none")}},
	{"bare key", "cmd=foo endcmd flag=1", Msg{Framing: V1, Cmd: "foo", Pairs: pairs("endcmd", "flag=1")}},
	{"CRLF", "cmd=get_maxes\r", Msg{Framing: V1, Cmd: "get_maxes"}},
	{"runs of blanks", "cmd=put  kvsname=a key=b   value=c ",
		Msg{Framing: V1, Cmd: "put", Pairs: pairs("kvsname=a", "key=b", "value=c")}},
	// Only a space separates fields (MPICH's parser, Hydra, Slurm): a tab
	// or a CR inside a value is the value's, and a CR only ends the line.
	{"tab and CR in values", "cmd=put kvsname=a\tkey=b value=c\rd\te\r",
		Msg{Framing: V1, Cmd: "put", Pairs: pairs("kvsname=a\tkey=b", "value=c\rd\te")}},
}

func TestDecodeV1(t *testing.T) {
	for _, tc := range v1Cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := decodeStream([]byte(tc.line + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || res[0].Err != nil {
				t.Fatalf("got %v, want one message", res)
			}
			if !reflect.DeepEqual(res[0].Msg, tc.want) {
				t.Fatalf("got %+v\nwant %+v", res[0].Msg, tc.want)
			}
		})
	}
}

// v2Cases covers every PMI-2 request form of pmi-wire.md §5-§6.
var v2Cases = []struct {
	name, body string
	want       Msg
}{
	{"fullinit mpich", "cmd=fullinit;pmirank=0;", Msg{Framing: V2, Cmd: "fullinit", Pairs: pairs("pmirank=0")}},
	{"fullinit slurm", "cmd=fullinit;pmijobid=5.0;pmirank=0;threaded=FALSE;",
		Msg{Framing: V2, Cmd: "fullinit", Pairs: pairs("pmijobid=5.0", "pmirank=0", "threaded=FALSE")}},
	{"fullinit srcid", "cmd=fullinit;pmijobid=5.0;srcid=3;threaded=FALSE;",
		Msg{Framing: V2, Cmd: "fullinit", Pairs: pairs("pmijobid=5.0", "srcid=3", "threaded=FALSE")}},
	{"fullinit bare", "cmd=fullinit;", Msg{Framing: V2, Cmd: "fullinit"}},
	{"finalize", "cmd=finalize;", Msg{Framing: V2, Cmd: "finalize"}},
	{"abort mpich", "cmd=abort;exitcode=-1;message=rank 3 gave up = sorry;",
		Msg{Framing: V2, Cmd: "abort", Pairs: pairs("exitcode=-1", "message=rank 3 gave up = sorry")}},
	{"abort slurm", "cmd=abort;isworld=TRUE;msg=oops;", Msg{Framing: V2, Cmd: "abort", Pairs: pairs("isworld=TRUE", "msg=oops")}},
	{"job-getid", "cmd=job-getid;", Msg{Framing: V2, Cmd: "job-getid"}},
	{"kvs-put", "cmd=kvs-put;key=example-k0;value=v0-of-2-x/y=z,w:q;",
		Msg{Framing: V2, Cmd: "kvs-put", Pairs: pairs("key=example-k0", "value=v0-of-2-x/y=z,w:q")}},
	{"kvs-fence", "cmd=kvs-fence;", Msg{Framing: V2, Cmd: "kvs-fence"}},
	{"kvs-get mpich", "cmd=kvs-get;jobid=kvs_1;key=bc-1;", Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=kvs_1", "key=bc-1")}},
	{"kvs-get slurm empty jobid", "cmd=kvs-get;jobid=;srcid=-1;key=bc-1;",
		Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=", "srcid=-1", "key=bc-1")}},
	{"info-putnodeattr", "cmd=info-putnodeattr;key=-bcast-1-0;value=2F6465;",
		Msg{Framing: V2, Cmd: "info-putnodeattr", Pairs: pairs("key=-bcast-1-0", "value=2F6465")}},
	{"info-getnodeattr", "cmd=info-getnodeattr;key=-bcast-1-0;wait=TRUE;",
		Msg{Framing: V2, Cmd: "info-getnodeattr", Pairs: pairs("key=-bcast-1-0", "wait=TRUE")}},
	{"info-getjobattr", "cmd=info-getjobattr;key=PMI_process_mapping;",
		Msg{Framing: V2, Cmd: "info-getjobattr", Pairs: pairs("key=PMI_process_mapping")}},
	{"name-publish", "cmd=name-publish;name=svc;port=p#1;infokeycount=0;",
		Msg{Framing: V2, Cmd: "name-publish", Pairs: pairs("name=svc", "port=p#1", "infokeycount=0")}},
	{"name-unpublish", "cmd=name-unpublish;name=svc;", Msg{Framing: V2, Cmd: "name-unpublish", Pairs: pairs("name=svc")}},
	{"name-lookup", "cmd=name-lookup;name=svc;infokeycount=0;",
		Msg{Framing: V2, Cmd: "name-lookup", Pairs: pairs("name=svc", "infokeycount=0")}},
	{"spawn", "cmd=spawn;ncmds=1;preputcount=0;subcmd=./a;maxprocs=2;argc=0;infokeycount=0;",
		Msg{Framing: V2, Cmd: "spawn", Pairs: pairs("ncmds=1", "preputcount=0", "subcmd=./a", "maxprocs=2", "argc=0", "infokeycount=0")}},
	{"spawn duplicate keys kept in order", "cmd=spawn;ncmds=2;preputcount=0;subcmd=a;maxprocs=1;argc=0;subcmd=b;maxprocs=2;argc=0;",
		Msg{Framing: V2, Cmd: "spawn", Pairs: pairs("ncmds=2", "preputcount=0", "subcmd=a", "maxprocs=1", "argc=0", "subcmd=b", "maxprocs=2", "argc=0")}},
	{"job-connect", "cmd=job-connect;jobid=j1;", Msg{Framing: V2, Cmd: "job-connect", Pairs: pairs("jobid=j1")}},
	{"job-disconnect", "cmd=job-disconnect;jobid=j1;", Msg{Framing: V2, Cmd: "job-disconnect", Pairs: pairs("jobid=j1")}},
	{"ring", "cmd=ring;ring-count=1;ring-left=a0;ring-right=a0;",
		Msg{Framing: V2, Cmd: "ring", Pairs: pairs("ring-count=1", "ring-left=a0", "ring-right=a0")}},
	{"thrid last", "cmd=kvs-get;jobid=x;key=k;thrid=0x7ffd1234;",
		Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=x", "key=k", "thrid=0x7ffd1234")}},
	{"escaped semicolons", "cmd=kvs-put;key=k;value=a;;b;;;",
		Msg{Framing: V2, Cmd: "kvs-put", Pairs: []Pair{{Key: "key", Val: "k"}, {Key: "value", Val: "a;b;"}}}},
	{"only an escaped semicolon", "cmd=kvs-put;value=;;;key=k;",
		Msg{Framing: V2, Cmd: "kvs-put", Pairs: []Pair{{Key: "value", Val: ";"}, {Key: "key", Val: "k"}}}},
	{"empty values", "cmd=kvs-get;jobid=;srcid=;key=k;", Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=", "srcid=", "key=k")}},
	{"no final semicolon", "cmd=kvs-put;key=k;value=v", Msg{Framing: V2, Cmd: "kvs-put", Pairs: pairs("key=k", "value=v")}},
	{"no final semicolon after cmd", "cmd=kvs-fence", Msg{Framing: V2, Cmd: "kvs-fence"}},
	{"value with LF and spaces", "cmd=kvs-put;key=k;value=line 1\nline 2;",
		Msg{Framing: V2, Cmd: "kvs-put", Pairs: pairs("key=k", "value=line 1\nline 2")}},
}

func TestDecodeV2(t *testing.T) {
	for _, tc := range v2Cases {
		for _, left := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/left=%v", tc.name, left), func(t *testing.T) {
				frame := frameV2(tc.body, left)
				res, err := decodeStream([]byte(frame))
				if err != nil {
					t.Fatal(err)
				}
				if len(res) != 1 || res[0].Err != nil {
					t.Fatalf("%q: got %v, want one message", frame, res)
				}
				if !reflect.DeepEqual(res[0].Msg, tc.want) {
					t.Fatalf("%q:\ngot  %+v\nwant %+v", frame, res[0].Msg, tc.want)
				}
			})
		}
	}
}

func TestMsgGetHas(t *testing.T) {
	m := Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=", "srcid=-1", "key=a", "key=b")}
	if v, ok := m.Get("jobid"); ok || v != "" {
		t.Errorf("Get(jobid) = %q, %v; an empty value must read as absent", v, ok)
	}
	if !m.Has("jobid") || m.Has("thrid") {
		t.Errorf("Has(jobid) = %v, Has(thrid) = %v", m.Has("jobid"), m.Has("thrid"))
	}
	if v, ok := m.Get("key"); !ok || v != "a" {
		t.Errorf("Get(key) = %q, %v; want the first value", v, ok)
	}
	if v, ok := Lookup(m.Pairs, "srcid"); !ok || v != "-1" {
		t.Errorf("Lookup(srcid) = %q, %v", v, ok)
	}
}

// conversation is a PMI-1 preamble, PMI-2 frames with both paddings, a
// PMI-1 spawn block and stray LFs, as one client stream.
func conversation() (stream []byte, want []result) {
	var b bytes.Buffer
	add := func(s string, m Msg) {
		b.WriteString(s)
		want = append(want, result{Msg: m})
	}
	add("cmd=init pmi_version=2 pmi_subversion=0\n", Msg{Framing: V1, Cmd: "init", Pairs: pairs("pmi_version=2", "pmi_subversion=0")})
	add("    23cmd=fullinit;pmirank=0;", Msg{Framing: V2, Cmd: "fullinit", Pairs: pairs("pmirank=0")})
	add("31    cmd=kvs-put;key=bc-0;value=abc;", Msg{Framing: V2, Cmd: "kvs-put", Pairs: pairs("key=bc-0", "value=abc")})
	b.WriteString("\n\n")
	add("    14cmd=kvs-fence;", Msg{Framing: V2, Cmd: "kvs-fence"})
	add("37    cmd=kvs-get;jobid=;srcid=-1;key=bc-1;", Msg{Framing: V2, Cmd: "kvs-get", Pairs: pairs("jobid=", "srcid=-1", "key=bc-1")})
	add("cmd=get_universe_size\n", Msg{Framing: V1, Cmd: "get_universe_size"})
	add("mcmd=spawn\nnprocs=2\nexecname=./a b\ntotspawns=2\nspawnssofar=1\nargcnt=1\narg1=x y\npreput_num=0\ninfo_num=0\nendcmd\n"+
		"\nmcmd=spawn\nnprocs=1\nexecname=./c\ntotspawns=2\nspawnssofar=2\nargcnt=0\ninfo_num=1\ninfo_key_0=wdir\ninfo_val_0=/tmp\nendcmd\n",
		Msg{Framing: V1, Cmd: "spawn", Segments: [][]Pair{
			pairs("nprocs=2", "execname=./a b", "totspawns=2", "spawnssofar=1", "argcnt=1", "arg1=x y", "preput_num=0", "info_num=0"),
			pairs("nprocs=1", "execname=./c", "totspawns=2", "spawnssofar=2", "argcnt=0", "info_num=1", "info_key_0=wdir", "info_val_0=/tmp"),
		}})
	b.WriteString("\n")
	add("    13cmd=finalize;", Msg{Framing: V2, Cmd: "finalize"})
	return b.Bytes(), want
}

// TestDecodeChunking decodes one stream whole, byte by byte, split in two
// at every offset and in random chunks; the results must not change.
func TestDecodeChunking(t *testing.T) {
	stream, want := conversation()
	check := func(name string, sizes ...int) {
		t.Helper()
		for _, dec := range []func([]byte, ...int) ([]result, error){decodeStream, fillStream} {
			got, err := dec(stream, sizes...)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := sameResults(got, want); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	check("whole")
	check("byte by byte", 1)
	for cut := 1; cut < len(stream); cut++ {
		check(fmt.Sprintf("cut at %d", cut), cut, len(stream))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		sizes := make([]int, 1+rng.IntN(8))
		for j := range sizes {
			sizes[j] = 1 + rng.IntN(40)
		}
		check(fmt.Sprintf("chunks %v", sizes), sizes...)
	}
}

// TestDecodeFillLarge reads a stream of many requests, some longer than
// the room Fill offers, in chunks of every size up to twice that room:
// the results are those of the whole stream fed at once, whichever way
// the reads cut it (compacting and growing the buffer on the way).
func TestDecodeFillLarge(t *testing.T) {
	var stream []byte
	for i := range 300 {
		value := strings.Repeat(string(rune('a'+i%26)), 1+i*37%(3*fillSpace))
		if i%2 == 0 {
			stream = append(stream, "cmd=put kvsname=k key=k"+fmt.Sprint(i)+" value="+value+"\n"...)
		} else {
			stream = append(stream, frameV2("cmd=kvs-put;key=k"+fmt.Sprint(i)+";value="+value+";", false)...)
		}
	}
	want, err := decodeStream(stream)
	if err != nil || len(want) != 300 {
		t.Fatalf("fed whole: %d results, %v", len(want), err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for run := range 20 {
		sizes := make([]int, 1+rng.IntN(16))
		for j := range sizes {
			sizes[j] = 1 + rng.IntN(2*fillSpace)
		}
		got, err := fillStream(stream, sizes...)
		if err != nil {
			t.Fatalf("run %d, chunks %v: %v", run, sizes, err)
		}
		if err := sameResults(got, want); err != nil {
			t.Fatalf("run %d, chunks %v: %v", run, sizes, err)
		}
	}
}

// TestDecodeSeveralPerFeed feeds a whole conversation at once and checks
// that Next yields every request before asking for more.
func TestDecodeSeveralPerFeed(t *testing.T) {
	stream, want := conversation()
	var d Decoder
	d.Feed(stream)
	for i, w := range want {
		m, ok, err := d.Next()
		if err != nil || !ok {
			t.Fatalf("request %d: ok=%v err=%v", i, ok, err)
		}
		if !reflect.DeepEqual(m, w.Msg) {
			t.Fatalf("request %d: got %+v want %+v", i, m, w.Msg)
		}
	}
	if m, ok, err := d.Next(); ok || err != nil {
		t.Fatalf("after the last request: %+v %v %v", m, ok, err)
	}
	if d.Buffered() != 0 {
		t.Fatalf("Buffered = %d after draining", d.Buffered())
	}
}

// TestDecodeInitThenV2 runs the PMI-1 init line of each version a client
// may send followed by PMI-2 frames on the same decoder.
func TestDecodeInitThenV2(t *testing.T) {
	for _, v := range [][2]string{{"1", "1"}, {"1", "2"}, {"2", "0"}} {
		stream := "cmd=init pmi_version=" + v[0] + " pmi_subversion=" + v[1] + "\n" +
			frameV2("cmd=fullinit;pmirank=1;", false) + frameV2("cmd=job-getid;", true)
		for _, size := range []int{1, 3, len(stream)} {
			got, err := decodeStream([]byte(stream), size)
			if err != nil {
				t.Fatal(err)
			}
			want := []result{
				{Msg: Msg{Framing: V1, Cmd: "init", Pairs: pairs("pmi_version="+v[0], "pmi_subversion="+v[1])}},
				{Msg: Msg{Framing: V2, Cmd: "fullinit", Pairs: pairs("pmirank=1")}},
				{Msg: Msg{Framing: V2, Cmd: "job-getid"}},
			}
			if err := sameResults(got, want); err != nil {
				t.Fatalf("init %s.%s, chunks of %d: %v", v[0], v[1], size, err)
			}
		}
	}
}

// TestDecodeSpawnBlockSplit cuts a three-segment spawn block at every pair
// of offsets.
func TestDecodeSpawnBlockSplit(t *testing.T) {
	var block strings.Builder
	var segs [][]Pair
	for i := 1; i <= 3; i++ {
		lines := []string{"nprocs=" + fmt.Sprint(i), "execname=/bin/prog " + fmt.Sprint(i), "totspawns=3",
			"spawnssofar=" + fmt.Sprint(i), "argcnt=1", "arg1=--flag=" + fmt.Sprint(i), "info_num=0"}
		block.WriteString("mcmd=spawn\n" + strings.Join(lines, "\n") + "\nendcmd\n")
		segs = append(segs, pairs(lines...))
	}
	stream := block.String() + "cmd=get_maxes\n"
	want := []result{
		{Msg: Msg{Framing: V1, Cmd: "spawn", Segments: segs}},
		{Msg: Msg{Framing: V1, Cmd: "get_maxes"}},
	}
	for a := 1; a < len(stream); a += 3 {
		for b := a + 1; b < len(stream); b += 7 {
			var d Decoder
			var got []result
			for _, part := range []string{stream[:a], stream[a:b], stream[b:]} {
				d.Feed([]byte(part))
				for {
					m, ok, err := d.Next()
					if err != nil {
						t.Fatalf("cuts %d,%d: %v", a, b, err)
					}
					if !ok {
						break
					}
					got = append(got, result{Msg: m})
				}
			}
			if err := sameResults(got, want); err != nil {
				t.Fatalf("cuts %d,%d: %v", a, b, err)
			}
		}
	}
}

func TestDecodeStrayLF(t *testing.T) {
	stream := "\n\ncmd=get_maxes\n\n\n" + frameV2("cmd=kvs-fence;", false) + "\n" +
		"mcmd=spawn\n\nnprocs=1\nexecname=a\ntotspawns=1\nspawnssofar=1\nargcnt=0\n\nendcmd\n\n\n" + frameV2("cmd=finalize;", true) + "\n"
	want := []result{
		{Msg: Msg{Framing: V1, Cmd: "get_maxes"}},
		{Msg: Msg{Framing: V2, Cmd: "kvs-fence"}},
		{Msg: Msg{Framing: V1, Cmd: "spawn", Segments: [][]Pair{pairs("nprocs=1", "execname=a", "totspawns=1", "spawnssofar=1", "argcnt=0")}}},
		{Msg: Msg{Framing: V2, Cmd: "finalize"}},
	}
	for _, size := range []int{1, 2, 5, len(stream)} {
		got, err := decodeStream([]byte(stream), size)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameResults(got, want); err != nil {
			t.Fatalf("chunks of %d: %v", size, err)
		}
	}
}

// TestDecodeMalformed checks that a malformed body gives a *SyntaxError
// naming the command when it is known, and that the requests after it
// still decode.
func TestDecodeMalformed(t *testing.T) {
	seg := func(tot, sofar string, extra ...string) string {
		return "mcmd=spawn\nnprocs=1\nexecname=a\n" + tot + "\n" + sofar + "\nargcnt=0\n" + strings.Join(extra, "") + "endcmd\n"
	}
	cases := []struct {
		name, in string
		framing  Framing
		cmd      string
		reason   string
	}{
		{"v1 empty command", "cmd= x=1\n", V1, "", "empty command name"},
		{"v1 empty key", "cmd=put =v key=k\n", V1, "put", "empty key"},
		{"v1 NUL in value", "cmd=put key=a\x00b\n", V1, "put", "NUL"},
		{"v1 NUL in command", "cmd=pu\x00t key=a\n", V1, "", "NUL"},
		{"v2 no equals", frameV2("kvs-fence;", false), V2, "", "without '='"},
		{"v2 not cmd first", frameV2("key=v;cmd=kvs-get;", true), V2, "", "does not start with cmd"},
		{"v2 empty command", frameV2("cmd=;key=v;", false), V2, "", "does not start with cmd"},
		{"v2 field without equals", frameV2("cmd=kvs-put;key;value=v;", false), V2, "kvs-put", "without '='"},
		{"v2 empty key", frameV2("cmd=kvs-put;=v;", true), V2, "kvs-put", "empty key"},
		{"v2 lone semicolon", frameV2(";", false), V2, "", "without '='"},
		{"v2 zero length", "     0", V2, "", "empty body"},
		{"unknown mcmd", "mcmd=foo\nx=1\nendcmd\n", V1, "foo", "unknown multi-line command"},
		{"spawn without totspawns", seg("x=1", "spawnssofar=1"), V1, "spawn", "bad totspawns"},
		{"spawn sofar beyond total", seg("totspawns=1", "spawnssofar=2"), V1, "spawn", "bad totspawns"},
		{"spawn empty key", seg("totspawns=1", "spawnssofar=1", "=x\n"), V1, "spawn", "empty key"},
		{"spawn block cut short", seg("totspawns=2", "spawnssofar=1"), V1, "spawn", "ends after 1 of 2 segments"},
		{"spawn too many segments", seg("totspawns=2", "spawnssofar=1") + seg("totspawns=2", "spawnssofar=1"), V1, "spawn", "says spawnssofar=1"},
	}
	after := "cmd=get_maxes\n" + frameV2("cmd=kvs-fence;", false)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, size := range []int{1, 4, len(tc.in) + len(after)} {
				got, err := decodeStream([]byte(tc.in+after), size)
				if err != nil {
					t.Fatalf("chunks of %d: %v", size, err)
				}
				if len(got) != 3 {
					t.Fatalf("chunks of %d: got %v, want an error and two requests", size, got)
				}
				var se *SyntaxError
				if !errors.As(got[0].Err, &se) {
					t.Fatalf("chunks of %d: got %v, want a *SyntaxError", size, got[0])
				}
				if se.Framing != tc.framing || se.Cmd != tc.cmd || !strings.Contains(se.Reason, tc.reason) {
					t.Fatalf("chunks of %d: got %+v, want framing %v cmd %q reason ~%q", size, se, tc.framing, tc.cmd, tc.reason)
				}
				if got[1].Msg.Cmd != "get_maxes" || got[2].Msg.Cmd != "kvs-fence" {
					t.Fatalf("chunks of %d: decoder not usable after the error: %v", size, got[1:])
				}
			}
		})
	}
}

// TestDecodeTooLong checks the MaxMessage bound at its edge for each kind
// of request, and that the error is sticky.
func TestDecodeTooLong(t *testing.T) {
	v1 := func(n int) string { return "cmd=put key=k value=" + strings.Repeat("v", n-len("cmd=put key=k value=")) }
	v2 := func(n int) string {
		head := "cmd=kvs-put;key=k;value="
		return frameV2(head+strings.Repeat("v", n-len(head)-1)+";", false)
	}
	spawn := func(n int) string {
		head := "mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=1\nspawnssofar=1\nargcnt=1\narg1="
		tail := "\nendcmd\n"
		return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
	}
	cases := []struct {
		name    string
		in      string
		tooLong bool
	}{
		{"v1 line at the limit", v1(MaxMessage) + "\n", false},
		{"v1 line over the limit", v1(MaxMessage+1) + "\n", true},
		{"v1 line over the limit, no LF yet", v1(MaxMessage + 1), true},
		{"v2 frame at the limit", v2(MaxMessage), false},
		{"v2 frame over the limit", v2(MaxMessage + 1), true},
		{"v2 header over the limit, no body yet", fmt.Sprintf("%-6d", MaxMessage+1), true},
		{"v2 header at the maximum", "999999", true},
		{"spawn block at the limit", spawn(MaxMessage), false},
		{"spawn block over the limit", spawn(MaxMessage + 1), true},
		{"spawn block over the limit, unfinished", spawn(MaxMessage + 1)[:MaxMessage+1], true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, size := range []int{len(tc.in), 4096, 1} {
				if size == 1 && testing.Short() {
					continue
				}
				got, err := decodeStream([]byte(tc.in), size)
				if tc.tooLong {
					if !errors.Is(err, ErrTooLong) || len(got) != 0 {
						t.Fatalf("chunks of %d: got %v, %v; want ErrTooLong", size, got, err)
					}
					continue
				}
				if err != nil || len(got) != 1 || got[0].Err != nil {
					t.Fatalf("chunks of %d: got %v, %v; want one request", size, got, err)
				}
			}
		})
	}
	var d Decoder
	d.Feed([]byte(v1(MaxMessage+1) + "\n"))
	_, _, err := d.Next()
	if !errors.Is(err, ErrTooLong) {
		t.Fatalf("got %v, want ErrTooLong", err)
	}
	d.Feed([]byte("cmd=get_maxes\n"))
	if _, ok, err2 := d.Next(); ok || err2 != err {
		t.Fatalf("after ErrTooLong: ok=%v err=%v, want the same error again", ok, err2)
	}
}

func TestDecodeBadHeader(t *testing.T) {
	for _, in := range []string{"abcdef", "3 1   ", "      ", "\t   31", "-5    ", "+5    ", "0x10  ", "x", "12a", " 1 \t", "cmx=a b\n", "mcmx=spawn\n"} {
		for _, size := range []int{1, len(in)} {
			got, err := decodeStream([]byte(in+"cmd=get_maxes\n"), size)
			if !errors.Is(err, ErrBadHeader) || len(got) != 0 {
				t.Errorf("%q in chunks of %d: got %v, %v; want ErrBadHeader", in, size, got, err)
			}
		}
	}
	var d Decoder
	d.Feed([]byte("zz"))
	_, _, err := d.Next()
	if !errors.Is(err, ErrBadHeader) {
		t.Fatalf("got %v, want ErrBadHeader", err)
	}
	d.Feed([]byte(frameV2("cmd=finalize;", false)))
	if _, ok, err2 := d.Next(); ok || err2 != err {
		t.Fatalf("after ErrBadHeader: ok=%v err=%v, want the same error again", ok, err2)
	}
}

// TestDecodeBuffered checks Buffered through a split frame and a split
// spawn block.
func TestDecodeBuffered(t *testing.T) {
	var d Decoder
	frame := frameV2("cmd=kvs-put;key=k;value=v;", false)
	d.Feed([]byte(frame[:10]))
	if _, ok, err := d.Next(); ok || err != nil || d.Buffered() != 10 {
		t.Fatalf("half a frame: ok=%v err=%v Buffered=%d", ok, err, d.Buffered())
	}
	d.Feed([]byte(frame[10:]))
	if _, ok, err := d.Next(); !ok || err != nil || d.Buffered() != 0 {
		t.Fatalf("whole frame: ok=%v err=%v Buffered=%d", ok, err, d.Buffered())
	}
	seg := "mcmd=spawn\nnprocs=1\nexecname=a\ntotspawns=2\nspawnssofar=1\nargcnt=0\nendcmd\n"
	d.Feed([]byte(seg + "mcmd=sp"))
	if _, ok, err := d.Next(); ok || err != nil || d.Buffered() != len(seg)+len("mcmd=sp") {
		t.Fatalf("one segment of two: ok=%v err=%v Buffered=%d, want %d", ok, err, d.Buffered(), len(seg)+7)
	}
}

// TestDecodeMsgOwnsStrings checks that a returned Msg survives later Feeds
// that reuse the decoder's buffer.
func TestDecodeMsgOwnsStrings(t *testing.T) {
	var d Decoder
	d.Feed([]byte(frameV2("cmd=kvs-put;key=aaaa;value=bbbb;", false)))
	m1, ok, err := d.Next()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	d.Feed([]byte(frameV2("cmd=kvs-put;key=cccc;value=dddd;", false)))
	m2, ok, err := d.Next()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	if v, _ := m1.Get("value"); v != "bbbb" {
		t.Fatalf("first message changed to %+v", m1)
	}
	if v, _ := m2.Get("value"); v != "dddd" {
		t.Fatalf("second message is %+v", m2)
	}
}
