package pmiwire

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the fuzz seed corpus derived from testdata/traces")

// chunkSizes turns fuzz bytes into Feed sizes of 1..64 bytes.
func chunkSizes(cuts []byte) []int {
	sizes := make([]int, len(cuts))
	for i, c := range cuts {
		sizes[i] = 1 + int(c%64)
	}
	return sizes
}

// FuzzDecoder feeds arbitrary bytes in arbitrary chunks. The decoder must
// not panic or spin, must give the same results however the bytes are
// split, and every request it returns must survive re-encoding.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte("cmd=init pmi_version=2 pmi_subversion=0\n    23cmd=fullinit;pmirank=0;"), []byte{3, 9})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole, wholeErr := decodeStream(data)
		split, splitErr := decodeStream(data, chunkSizes(cuts)...)
		for _, err := range []error{wholeErr, splitErr} {
			if err != nil && !errors.Is(err, ErrTooLong) && !errors.Is(err, ErrBadHeader) {
				t.Fatal(err)
			}
		}
		if err := sameResults(whole, split); err != nil {
			t.Fatalf("chunking changed the results: %v", err)
		}
		if !sameSticky(wholeErr, splitErr) {
			t.Fatalf("chunking changed the framing error: %v vs %v", wholeErr, splitErr)
		}
		for _, r := range whole {
			if r.Err == nil {
				checkReencode(t, r.Msg)
			}
		}
	})
}

// checkReencode encodes a decoded request again and decodes the result,
// which must give the same request (a spawn request: the same Spawn).
func checkReencode(t *testing.T, m Msg) {
	t.Helper()
	if m.Cmd == "" || (m.Framing != V1 && m.Framing != V2) {
		t.Fatalf("decoder returned %+v", m)
	}
	if m.Segments != nil {
		sp, err := ParseSpawn(&m)
		if err == nil {
			checkSpawnRoundTrip(t, sp)
		}
		return
	}
	for _, left := range []bool{false, true} {
		wire := appendMsg(nil, m, left)
		if len(wire) > MaxMessage {
			return
		}
		res, err := decodeStream(wire)
		if err != nil || len(res) != 1 {
			t.Fatalf("re-encoded %+v as %q: %v %v", m, wire, res, err)
		}
		if err := sameResult(res[0], result{Msg: m}); err != nil {
			t.Fatalf("re-encoded as %q: %v", wire, err)
		}
	}
}

// v1Safe reports whether every value of sp can travel in a PMI-1 spawn
// line unchanged.
func v1Safe(sp *Spawn) bool {
	ok := func(s string) bool { return !strings.Contains(s, "\n") && !strings.HasSuffix(s, "\r") }
	okPairs := func(ps []Pair) bool {
		for _, p := range ps {
			if !ok(p.Key) || !ok(p.Val) {
				return false
			}
		}
		return true
	}
	for _, c := range sp.Cmds {
		if !ok(c.Exe) || !okPairs(c.Info) {
			return false
		}
		for _, a := range c.Args {
			if !ok(a) {
				return false
			}
		}
	}
	return okPairs(sp.Preput)
}

// checkSpawnRoundTrip checks what ParseSpawn promises about a Spawn it
// returned, then encodes it in each framing that can carry it and parses it
// back.
func checkSpawnRoundTrip(t *testing.T, sp *Spawn) {
	t.Helper()
	if len(sp.Cmds) == 0 {
		t.Fatalf("spawn without commands: %+v", sp)
	}
	for _, c := range sp.Cmds {
		if c.Exe == "" || c.MaxProcs < 1 {
			t.Fatalf("invalid command accepted: %+v", c)
		}
	}
	for _, p := range append(sp.Preput[:len(sp.Preput):len(sp.Preput)], infoOf(sp)...) {
		if p.Key == "" {
			t.Fatalf("empty key accepted: %+v", sp)
		}
	}
	encoders := []func([]byte, *Spawn) []byte{AppendSpawnV2}
	if v1Safe(sp) {
		encoders = append(encoders, AppendSpawnV1)
	}
	for _, enc := range encoders {
		wire := enc(nil, sp)
		if len(wire) > MaxMessage {
			continue
		}
		res, err := decodeStream(wire)
		if err != nil || len(res) != 1 || res[0].Err != nil {
			t.Fatalf("re-encoded spawn %q: %v %v", wire, res, err)
		}
		got, err := ParseSpawn(&res[0].Msg)
		if err != nil {
			t.Fatalf("re-encoded spawn %q: %v", wire, err)
		}
		if !reflect.DeepEqual(got, sp) {
			t.Fatalf("re-encoded spawn %q:\ngot  %+v\nwant %+v", wire, got, sp)
		}
	}
}

func infoOf(sp *Spawn) []Pair {
	var out []Pair
	for _, c := range sp.Cmds {
		out = append(out, c.Info...)
	}
	return out
}

// FuzzParseSpawn runs ParseSpawn on arbitrary PMI-2 bodies and on whatever
// an arbitrary stream decodes to. It must not panic or allocate by the
// announced counts, and what it accepts must be a valid request that
// survives re-encoding.
func FuzzParseSpawn(f *testing.F) {
	f.Add([]byte("cmd=spawn;ncmds=1;preputcount=0;subcmd=a;maxprocs=1;argc=1;argv0=x;"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []Msg
		if m, err := parseV2Body(data); err == nil {
			msgs = append(msgs, m)
		}
		res, _ := decodeStream(data)
		for _, r := range res {
			if r.Err == nil {
				msgs = append(msgs, r.Msg)
			}
		}
		for _, m := range msgs {
			sp, err := ParseSpawn(&m)
			var se *SyntaxError
			switch {
			case err == nil && sp != nil:
				checkSpawnRoundTrip(t, sp)
			case err == nil || sp != nil || !errors.As(err, &se):
				t.Fatalf("ParseSpawn(%+v) = %+v, %v", m, sp, err)
			}
		}
	})
}

// seedCorpus derives the fuzz seeds from the recorded conversations: each
// side of each conversation as one stream, and every spawn request alone.
func seedCorpus(t *testing.T) map[string][][]byte {
	seeds := map[string][][]byte{}
	cuts := []byte{0, 5, 17, 1, 63, 2}
	for _, path := range traceFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".txt")
		for i, conv := range readTrace(t, path) {
			for _, sent := range []bool{true, false} {
				var stream []byte
				for _, m := range conv {
					if m.Sent != sent {
						continue
					}
					stream = append(stream, wire(m)...)
					if sent && strings.Contains(m.Text, "spawn") {
						body := wire(m)
						if m.V2 {
							body = m.Text
						}
						seeds[fmt.Sprintf("FuzzParseSpawn/%s-%d-line%d", name, i, m.Line)] = [][]byte{[]byte(body)}
					}
				}
				side := map[bool]string{true: "requests", false: "responses"}[sent]
				seeds[fmt.Sprintf("FuzzDecoder/%s-%d-%s", name, i, side)] = [][]byte{stream, cuts}
			}
		}
	}
	stream, _ := conversation()
	seeds["FuzzDecoder/mixed-conversation"] = [][]byte{stream, {0}}
	seeds["FuzzParseSpawn/two-segments"] = [][]byte{[]byte(segment("nprocs=2", "execname=/bin/a", "totspawns=2",
		"spawnssofar=1", "argcnt=1", "arg1=x y", "preput_num=1", "preput_key_0=k", "preput_val_0=v", "info_num=1",
		"info_key_0=wdir", "info_val_0=/tmp") + segment("nprocs=1", "execname=/bin/b", "totspawns=2", "spawnssofar=2", "argcnt=0"))}
	seeds["FuzzParseSpawn/two-commands-thrid"] = [][]byte{[]byte("cmd=spawn;ncmds=2;preputcount=1;ppkey0=k;ppval0=v;" +
		"subcmd=a;maxprocs=2;argc=2;argv0=x;argv1=y;infokeycount=1;infokey0=host;infoval0=n1;" +
		"subcmd=b;maxprocs=1;argc=0;thrid=0x1;")}
	return seeds
}

func encodeCorpusFile(args [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		fmt.Fprintf(&b, "[]byte(%q)\n", a)
	}
	return b.Bytes()
}

// TestFuzzSeeds keeps testdata/fuzz in step with the traces; run with
// -update-seeds to rewrite the derived seeds. Seeds the fuzzer found are
// left alone.
func TestFuzzSeeds(t *testing.T) {
	for name, args := range seedCorpus(t) {
		path := filepath.Join("testdata", "fuzz", name)
		want := encodeCorpusFile(args)
		if *updateSeeds {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestFuzzSeeds -update-seeds)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s is out of date (run go test -run TestFuzzSeeds -update-seeds)", path)
		}
	}
}
