package pmiwire

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// traceMsg is one message of a recorded conversation (testdata/traces).
type traceMsg struct {
	line   int    // line number in the trace file
	sent   bool   // '>' (rank to server) rather than '<'
	v2     bool   // PMI-2 frame
	length int    // announced body length of a PMI-2 frame
	edited bool   // a value was shortened or replaced: length not checkable
	text   string // PMI-1 line without LF, PMI-1 spawn block with its LFs, or PMI-2 body
}

// wire is the message as its sender put it on the wire: MPICH-style
// right-aligned headers for requests, left-aligned ones for responses.
func (m traceMsg) wire() string {
	switch {
	case m.v2:
		return frameV2(m.text, !m.sent)
	case strings.HasPrefix(m.text, "mcmd="):
		return m.text
	}
	return m.text + "\n"
}

var traceV2Line = regexp.MustCompile(`^\[v2 len=(\d+)\] (.*)$`)

// readTrace splits a trace file into its conversations ("=== pid" headers).
// Consecutive lines of a PMI-1 spawn block become one message.
func readTrace(t *testing.T, path string) [][]traceMsg {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var convs [][]traceMsg
	inBlock := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "=== pid") {
			convs = append(convs, nil)
			continue
		}
		trim := strings.TrimLeft(line, " ")
		if len(convs) == 0 || len(trim) < 2 || (trim[0] != '>' && trim[0] != '<') {
			continue
		}
		m := traceMsg{line: n, sent: trim[0] == '>', text: trim[2:]}
		cur := &convs[len(convs)-1]
		if inBlock {
			last := &(*cur)[len(*cur)-1]
			last.text += m.text + "\n"
			// A block goes on after "endcmd" only if another segment follows;
			// the decision is taken when the next line arrives.
			if m.text == "endcmd" {
				inBlock = false
			}
			continue
		}
		if m.sent && strings.HasPrefix(m.text, "mcmd=") && len(*cur) > 0 {
			if last := &(*cur)[len(*cur)-1]; strings.HasSuffix(last.text, "endcmd\n") {
				last.text += m.text + "\n" // next segment of the same block
				inBlock = true
				continue
			}
		}
		if m.sent && strings.HasPrefix(m.text, "mcmd=") {
			m.text += "\n"
			inBlock = true
		}
		if sm := traceV2Line.FindStringSubmatch(m.text); sm != nil {
			m.v2 = true
			m.length, _ = strconv.Atoi(sm[1])
			m.text = sm[2]
		}
		m.edited = strings.Contains(m.text, "...(") || strings.Contains(m.text, "<hwloc-xml-file>") ||
			(m.v2 && strings.HasPrefix(m.text, "cmd=spawn;")) // see testdata/traces/README.md
		*cur = append(*cur, m)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return convs
}

func traceFiles(t *testing.T) []string {
	files, err := filepath.Glob("testdata/traces/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no traces: %v", err)
	}
	return files
}

// TestTraces replays every recorded conversation: each side's messages,
// fed to a decoder one byte at a time, decode to the command the trace
// shows, and encoding the decoded message gives back the recorded bytes.
func TestTraces(t *testing.T) {
	for _, path := range traceFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			convs := readTrace(t, path)
			if len(convs) == 0 {
				t.Fatal("no conversations")
			}
			for _, conv := range convs {
				for _, sent := range []bool{true, false} {
					replay(t, conv, sent)
				}
			}
		})
	}
}

func replay(t *testing.T, conv []traceMsg, sent bool) {
	t.Helper()
	var msgs []traceMsg
	var stream []byte
	for _, m := range conv {
		if m.sent == sent {
			msgs = append(msgs, m)
			stream = append(stream, m.wire()...)
		}
	}
	got, err := decodeStream(stream, 1)
	if err != nil {
		t.Fatalf("line %d on: %v", msgs[0].line, err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("conversation from line %d: %d messages decoded, %d in the trace", msgs[0].line, len(got), len(msgs))
	}
	for i, tm := range msgs {
		r := got[i]
		if r.Err != nil {
			t.Fatalf("line %d: %v", tm.line, r.Err)
		}
		m := r.Msg
		if tm.v2 && !tm.edited && len(tm.text) != tm.length {
			t.Errorf("line %d: body of %d bytes, trace announces %d", tm.line, len(tm.text), tm.length)
		}
		wantCmd := strings.TrimPrefix(strings.TrimPrefix(tm.text, "mcmd="), "cmd=")
		wantCmd = wantCmd[:strings.IndexAny(wantCmd+" ;\n", " ;\n")]
		if m.Cmd != wantCmd || (m.Framing == V2) != tm.v2 {
			t.Errorf("line %d: decoded %v %q, trace shows %q", tm.line, m.Framing, m.Cmd, tm.text)
		}
		var again []byte
		switch {
		case m.Segments != nil:
			sp, err := ParseSpawn(&m)
			if err != nil {
				t.Fatalf("line %d: %v", tm.line, err)
			}
			again = AppendSpawnV1(nil, sp)
		case m.Cmd == "spawn" && m.Framing == V2:
			sp, err := ParseSpawn(&m)
			if err != nil {
				t.Fatalf("line %d: %v", tm.line, err)
			}
			again = AppendSpawnV2(nil, sp)
		default:
			again = appendMsg(nil, m, !tm.sent)
		}
		if string(again) != tm.wire() {
			t.Errorf("line %d: re-encoded as\n%q\ntrace has\n%q", tm.line, again, tm.wire())
		}
	}
}
