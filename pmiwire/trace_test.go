package pmiwire

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/internal/pmitrace"
)

// traceMsg is one message of a recorded conversation (testdata/traces).
type traceMsg = pmitrace.Msg

// wire is the message as its sender put it on the wire: MPICH-style
// right-aligned headers for requests, left-aligned ones for responses.
func wire(m traceMsg) string {
	switch {
	case m.V2:
		return frameV2(m.Text, !m.Sent)
	case strings.HasPrefix(m.Text, "mcmd="):
		return m.Text
	}
	return m.Text + "\n"
}

// readTrace splits a trace file into its conversations.
func readTrace(t *testing.T, path string) [][]traceMsg {
	t.Helper()
	convs, err := pmitrace.Read(path)
	if err != nil {
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
		if m.Sent == sent {
			msgs = append(msgs, m)
			stream = append(stream, wire(m)...)
		}
	}
	got, err := decodeStream(stream, 1)
	if err != nil {
		t.Fatalf("line %d on: %v", msgs[0].Line, err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("conversation from line %d: %d messages decoded, %d in the trace", msgs[0].Line, len(got), len(msgs))
	}
	for i, tm := range msgs {
		r := got[i]
		if r.Err != nil {
			t.Fatalf("line %d: %v", tm.Line, r.Err)
		}
		m := r.Msg
		if tm.V2 && !tm.Edited && len(tm.Text) != tm.Length {
			t.Errorf("line %d: body of %d bytes, trace announces %d", tm.Line, len(tm.Text), tm.Length)
		}
		wantCmd := strings.TrimPrefix(strings.TrimPrefix(tm.Text, "mcmd="), "cmd=")
		wantCmd = wantCmd[:strings.IndexAny(wantCmd+" ;\n", " ;\n")]
		if m.Cmd != wantCmd || (m.Framing == V2) != tm.V2 {
			t.Errorf("line %d: decoded %v %q, trace shows %q", tm.Line, m.Framing, m.Cmd, tm.Text)
		}
		var again []byte
		switch {
		case m.Segments != nil:
			sp, err := ParseSpawn(&m)
			if err != nil {
				t.Fatalf("line %d: %v", tm.Line, err)
			}
			again = AppendSpawnV1(nil, sp)
		case m.Cmd == "spawn" && m.Framing == V2:
			sp, err := ParseSpawn(&m)
			if err != nil {
				t.Fatalf("line %d: %v", tm.Line, err)
			}
			again = AppendSpawnV2(nil, sp)
		default:
			again = appendMsg(nil, m, !tm.Sent)
		}
		if string(again) != wire(tm) {
			t.Errorf("line %d: re-encoded as\n%q\ntrace has\n%q", tm.Line, again, wire(tm))
		}
	}
}
