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

// TestEncodeTranscripts builds every line of the byte-exact transcripts of
// pmi-wire.md §9a and decodes the client side back.
func TestEncodeTranscripts(t *testing.T) {
	p := func(kv ...string) []Pair { return pairs(kv...) }
	cases := []struct {
		got, want string
		request   bool // a client line: must decode back to its fields
	}{
		// PMI-1.
		{string(AppendV1(nil, "init", p("pmi_version=1", "pmi_subversion=1")...)), "cmd=init pmi_version=1 pmi_subversion=1\n", true},
		{string(NewResp(V1, "response_to_init").AddInt("rc", 0).AddInt("pmi_version", 1).AddInt("pmi_subversion", 1).Append(nil)),
			"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n", false},
		{string(AppendV1(nil, "get_maxes")), "cmd=get_maxes\n", true},
		{string(NewResp(V1, "maxes").AddInt("rc", RCSuccess).AddInt("kvsname_max", KVSNameMax).
			AddInt("keylen_max", KeyLenMax).AddInt("vallen_max", ValLenMax).Append(nil)),
			"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n", false},
		{string(AppendV1(nil, "get_my_kvsname")), "cmd=get_my_kvsname\n", true},
		{string(NewResp(V1, "my_kvsname").AddInt("rc", 0).Add("kvsname", "kvs_1234_0").Append(nil)), "cmd=my_kvsname rc=0 kvsname=kvs_1234_0\n", false},
		{string(AppendV1(nil, "put", p("kvsname=kvs_1234_0", "key=bc-0", "value=abc")...)), "cmd=put kvsname=kvs_1234_0 key=bc-0 value=abc\n", true},
		{string(NewResp(V1, "put_result").AddInt("rc", 0).Append(nil)), "cmd=put_result rc=0\n", false},
		{string(AppendV1(nil, "barrier_in")), "cmd=barrier_in\n", true},
		{string(NewResp(V1, "barrier_out").Append(nil)), "cmd=barrier_out\n", false},
		{string(AppendV1(nil, "get", p("kvsname=kvs_1234_0", "key=bc-1")...)), "cmd=get kvsname=kvs_1234_0 key=bc-1\n", true},
		{string(NewResp(V1, "get_result").AddInt("rc", 0).Add("value", "xyz").Append(nil)), "cmd=get_result rc=0 value=xyz\n", false},
		{string(AppendV1(nil, "finalize")), "cmd=finalize\n", true},
		{string(NewResp(V1, "finalize_ack").Append(nil)), "cmd=finalize_ack\n", false},
		// PMI-2: client headers right-aligned, server headers left-aligned.
		{string(AppendV1(nil, "init", p("pmi_version=2", "pmi_subversion=0")...)), "cmd=init pmi_version=2 pmi_subversion=0\n", true},
		{string(NewResp(V1, "response_to_init").AddInt("rc", 0).AddInt("pmi_version", 2).AddInt("pmi_subversion", 0).Append(nil)),
			"cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n", false},
		{string(AppendRequestV2(nil, "fullinit", p("pmirank=0")...)), "    23cmd=fullinit;pmirank=0;", true},
		{string(NewResp(V2, "fullinit-response").AddInt("rc", 0).AddInt("pmi-version", 2).AddInt("pmi-subversion", 0).
			AddInt("rank", 0).AddInt("size", 2).AddInt("appnum", 0).AddBool("debugged", false).AddBool("pmiverbose", false).Append(nil)),
			"113   cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=0;size=2;appnum=0;debugged=FALSE;pmiverbose=FALSE;", false},
		{string(AppendRequestV2(nil, "kvs-put", p("key=bc-0", "value=abc")...)), "    31cmd=kvs-put;key=bc-0;value=abc;", true},
		{string(NewResp(V2, "kvs-put-response").AddInt("rc", 0).Append(nil)), "26    cmd=kvs-put-response;rc=0;", false},
		{string(AppendRequestV2(nil, "kvs-fence")), "    14cmd=kvs-fence;", true},
		{string(NewResp(V2, "kvs-fence-response").AddInt("rc", 0).Append(nil)), "28    cmd=kvs-fence-response;rc=0;", false},
		{string(AppendV2(nil, "kvs-get", p("jobid=", "srcid=-1", "key=bc-1")...)), "37    cmd=kvs-get;jobid=;srcid=-1;key=bc-1;", true},
		{string(NewResp(V2, "kvs-get-response").AddInt("rc", 0).AddBool("found", true).Add("value", "xyz").Append(nil)),
			"47    cmd=kvs-get-response;rc=0;found=TRUE;value=xyz;", false},
		{string(AppendV2(nil, "ring", p("ring-count=1", "ring-left=a0", "ring-right=a0")...)), "49    cmd=ring;ring-count=1;ring-left=a0;ring-right=a0;", true},
		{string(NewResp(V2, "ring-response").AddInt("rc", 0).AddInt("ring-count", 0).Add("ring-left", "a1").Add("ring-right", "a1").Append(nil)),
			"63    cmd=ring-response;rc=0;ring-count=0;ring-left=a1;ring-right=a1;", false},
		{string(AppendRequestV2(nil, "finalize")), "    13cmd=finalize;", true},
		{string(NewResp(V2, "finalize-response").AddInt("rc", 0).Append(nil)), "27    cmd=finalize-response;rc=0;", false},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("got  %q\nwant %q", tc.got, tc.want)
		}
	}
	// The client lines, as one stream, decode to what was encoded.
	var stream []byte
	var want []result
	for _, tc := range cases {
		if !tc.request {
			continue
		}
		stream = append(stream, tc.want...)
		res, err := decodeStream([]byte(tc.want))
		if err != nil || len(res) != 1 || res[0].Err != nil {
			t.Fatalf("%q: %v %v", tc.want, res, err)
		}
		want = append(want, res...)
	}
	got, err := decodeStream(stream, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameResults(got, want); err != nil {
		t.Fatal(err)
	}
	if m := want[len(want)-3].Msg; m.Cmd != "kvs-get" || !m.Has("jobid") || m.Pairs[1] != (Pair{Key: "srcid", Val: "-1"}) {
		t.Fatalf("Slurm kvs-get decoded as %+v", m)
	}
}

func TestAppendV1Sanitizes(t *testing.T) {
	got := string(AppendV1(nil, "abort x", Pair{Key: "k y=z", Val: "a b\nc\td\re\x00f=g"}, Pair{Key: "endcmd", NoVal: true}))
	want := "cmd=abort_x k_y_z=a_b_c\td\re_f=g endcmd\n"
	if got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	// A CR ending the line would read as a CRLF line end.
	got = string(AppendV1(nil, "get_result", Pair{Key: "rc", Val: "0"}, Pair{Key: "value", Val: "a\tb\r"}))
	if want := "cmd=get_result rc=0 value=a\tb_\n"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if bytes.Count([]byte(got), []byte("\n")) != 1 {
		t.Fatalf("line breaks framing: %q", got)
	}
	// An error message with spaces becomes one token, as Slurm sends it.
	got = string(NewResp(V1, "barrier_out").AddInt("rc", RCFail).Add("msg", "fence timed out").Append(nil))
	if got != "cmd=barrier_out rc=-1 msg=fence_timed_out\n" {
		t.Fatalf("got %q", got)
	}
}

func TestAppendV2Escapes(t *testing.T) {
	got := string(AppendV2(nil, "kvs-get-response", Pair{Key: "rc", Val: "0"}, Pair{Key: "value", Val: "a;b;;c;"},
		Pair{Key: "k=;", Val: ""}))
	want := "49    cmd=kvs-get-response;rc=0;value=a;;b;;;;c;;;k__=;"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	res, err := decodeStream([]byte(got))
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("%v %v", res, err)
	}
	if v, _ := res[0].Msg.Get("value"); v != "a;b;;c;" {
		t.Fatalf("value decoded as %q", v)
	}
	// A ';' in the command name is escaped like a value.
	got = string(AppendV2(nil, "x;y"))
	if got != "9     cmd=x;;y;" {
		t.Fatalf("got %q", got)
	}
}

func TestAppendV2TooLong(t *testing.T) {
	big := strings.Repeat("0,", MaxFrame/2)
	prefix := []byte("keep")
	out := AppendV2(prefix, "spawn-response", Pair{Key: "rc", Val: "0"}, Pair{Key: "errcodes", Val: big})
	if !bytes.HasPrefix(out, prefix) {
		t.Fatalf("prefix lost: %q", out[:10])
	}
	want := "103   cmd=spawn-response;rc=-1;errmsg=response too long (1000032 bytes, over the 999999 a PMI-2 frame holds);"
	if string(out[len(prefix):]) != want {
		t.Fatalf("got %q want %q", out[len(prefix):], want)
	}
	// Just at the limit the frame is written as asked.
	body := "cmd=x;v="
	val := strings.Repeat("a", MaxFrame-len(body)-1)
	out = AppendV2(nil, "x", Pair{Key: "v", Val: val})
	if string(out[:6]) != "999999" || len(out) != 6+MaxFrame {
		t.Fatalf("header %q, length %d", out[:6], len(out))
	}
}

func TestAppendRequestV2Header(t *testing.T) {
	for _, n := range []int{0, 1, 5, 94, 995, 9995, 99995} {
		out := AppendRequestV2([]byte("x"), "c", Pair{Key: "v", Val: strings.Repeat("a", n)})
		body := out[1+6:]
		want := fmt.Sprintf("%6d", len(body))
		if string(out[1:7]) != want {
			t.Fatalf("value of %d bytes: header %q, want %q", n, out[1:7], want)
		}
		left := AppendV2(nil, "c", Pair{Key: "v", Val: strings.Repeat("a", n)})
		if string(left[:6]) != fmt.Sprintf("%-6d", len(body)) || !bytes.Equal(left[6:], body) {
			t.Fatalf("value of %d bytes: AppendV2 gave %q", n, left[:6])
		}
	}
}

// TestResponseName covers every PMI-1 command of pmi-wire.md §4 and the
// PMI-2 naming rule.
func TestResponseName(t *testing.T) {
	v1 := map[string]string{
		"init":              "response_to_init",
		"initack":           "initack",
		"get_maxes":         "maxes",
		"get_universe_size": "universe_size",
		"get_appnum":        "appnum",
		"get_my_kvsname":    "my_kvsname",
		"put":               "put_result",
		"get":               "get_result",
		"barrier_in":        "barrier_out",
		"publish_name":      "publish_result",
		"unpublish_name":    "unpublish_result",
		"lookup_name":       "lookup_result",
		"finalize":          "finalize_ack",
		"spawn":             "spawn_result",
		"create_kvs":        "newkvs",
		"destroy_kvs":       "kvs_destroyed",
		"getbyidx":          "getbyidx_results",
		"frobnicate":        "frobnicate_result",
		"":                  "error",
	}
	for cmd, want := range v1 {
		if got := ResponseName(V1, cmd); got != want {
			t.Errorf("ResponseName(V1, %q) = %q, want %q", cmd, got, want)
		}
	}
	for _, cmd := range []string{"fullinit", "finalize", "abort", "job-getid", "kvs-put", "kvs-fence", "kvs-get",
		"info-putnodeattr", "info-getnodeattr", "info-getjobattr", "name-publish", "name-unpublish", "name-lookup",
		"spawn", "job-connect", "job-disconnect", "ring", "frobnicate"} {
		if got := ResponseName(V2, cmd); got != cmd+"-response" {
			t.Errorf("ResponseName(V2, %q) = %q", cmd, got)
		}
	}
	if got := ResponseName(V2, ""); got != "error-response" {
		t.Errorf("ResponseName(V2, \"\") = %q", got)
	}
	// A client's garbage is not echoed back in a response's name.
	for _, cmd := range []string{"\x00", "\xff\xfe", "a\x1b[31m", "a b", "a;b", "k=v", "\x7f"} {
		if got := ResponseName(V1, cmd); got != "error" {
			t.Errorf("ResponseName(V1, %q) = %q, want error", cmd, got)
		}
		if got := ResponseName(V2, cmd); got != "error-response" {
			t.Errorf("ResponseName(V2, %q) = %q, want error-response", cmd, got)
		}
	}
}

// Alphabets for random messages: what each framing can carry unchanged.
const (
	keyAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	cmdAlphabet = "abcdefghijklmnopqrstuvwxyz-_"
	// PMI-1 values: no space, CR, LF or NUL; '=', '#$' and tabs allowed.
	v1ValAlphabet = keyAlphabet + "=#$:,./()[]<>\t"
	// PMI-2 values: anything, ';' and LF included.
	v2ValAlphabet = v1ValAlphabet + " ;;\n\t\r\x00\xff"
)

func randString(rng *rand.Rand, alphabet string, minLen, maxLen int) string {
	b := make([]byte, minLen+rng.IntN(maxLen-minLen+1))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// randMsg draws a request of the given framing whose fields use only what
// that framing can carry.
func randMsg(rng *rand.Rand, f Framing) Msg {
	m := Msg{Framing: f, Cmd: randString(rng, cmdAlphabet, 1, 20)}
	for range rng.IntN(6) {
		p := Pair{Key: randString(rng, keyAlphabet, 1, KeyLenMax)}
		if f == V1 {
			if rng.IntN(5) == 0 {
				p.NoVal = true
			} else {
				p.Val = randString(rng, v1ValAlphabet, 0, 40)
			}
		} else {
			p.Val = randString(rng, v2ValAlphabet, 0, 40)
		}
		m.Pairs = append(m.Pairs, p)
	}
	return m
}

func appendMsg(dst []byte, m Msg, left bool) []byte {
	switch {
	case m.Framing == V1:
		return AppendV1(dst, m.Cmd, m.Pairs...)
	case left:
		return AppendV2(dst, m.Cmd, m.Pairs...)
	}
	return AppendRequestV2(dst, m.Cmd, m.Pairs...)
}

// TestRoundTripRandom is the encode/decode property: random requests of
// both framings, encoded back to back and decoded in random chunks, come
// back equal.
func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := 0; iter < 300; iter++ {
		var stream []byte
		var want []result
		for range 1 + rng.IntN(8) {
			f := V1
			if rng.IntN(2) == 0 {
				f = V2
			}
			m := randMsg(rng, f)
			stream = appendMsg(stream, m, rng.IntN(2) == 0)
			if rng.IntN(4) == 0 {
				stream = append(stream, '\n') // stray LF between messages
			}
			want = append(want, result{Msg: m})
		}
		got, err := decodeStream(stream, 1+rng.IntN(50), 1+rng.IntN(7))
		if err != nil {
			t.Fatalf("iteration %d: %v\nstream %q", iter, err, stream)
		}
		if err := sameResults(got, want); err != nil {
			t.Fatalf("iteration %d: %v\nstream %q", iter, err, stream)
		}
	}
}

// TestDecodeErrorsWrap checks that the sticky errors name the offending
// header or length and still match the sentinels.
func TestDecodeErrorsWrap(t *testing.T) {
	_, err := decodeStream([]byte("3 1   cmd=x;"))
	if !errors.Is(err, ErrBadHeader) || !strings.Contains(err.Error(), `"3 1   "`) {
		t.Fatalf("got %v", err)
	}
	_, err = decodeStream([]byte("70000 "))
	if !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), "70000") {
		t.Fatalf("got %v", err)
	}
	var se *SyntaxError
	res, _ := decodeStream([]byte(frameV2("cmd=kvs-put;=v;", false)))
	if len(res) != 1 || !errors.As(res[0].Err, &se) || !reflect.DeepEqual(*se, SyntaxError{Framing: V2, Cmd: "kvs-put", Reason: "field with empty key"}) {
		t.Fatalf("got %v", res)
	}
	if s := se.Error(); s != `pmiwire: malformed PMI-2 "kvs-put" request: field with empty key` {
		t.Fatalf("Error() = %q", s)
	}
}

// TestResponseAllocs: the agent builds a response for every request; a
// typical one (a kvs-get answer, four fields) costs the Resp and its
// bytes, nothing more (Pairs' first storage is in the Resp, Append grows
// its buffer once, a known command's response name is made once).
func TestResponseAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates (the count is checked without it)")
	}
	val := strings.Repeat("v", 60)
	for _, f := range []Framing{V1, V2} {
		cmd := "get"
		if f == V2 {
			cmd = "kvs-get"
		}
		allocs := testing.AllocsPerRun(100, func() {
			r := NewResp(f, ResponseName(f, cmd)).Add("rc", "0").Add("found", "TRUE").Add("value", val).Add("msg", "ok")
			_ = r.Append(nil)
		})
		if allocs > 2 {
			t.Errorf("framing %v: %.1f allocations per response, want 2", f, allocs)
		}
	}
}
