// Command tracerank is an e2e test rank that replays one side of a
// recorded PMI conversation (pmiwire/testdata/traces) against the agent
// it was started by, as the MPI library that was recorded would:
//
//	TRACERANK_TRACE=TRACE tracerank
//
// The trace holds the conversations of one parent rank (the first) and of
// the children it spawned, in rank order. A rank that is not spawned
// replays the first conversation; a spawned rank R the conversation 1+R.
// Requests are sent as recorded, with three substitutions: job ids
// (kvsname, jobid) become the ones this run's agent gave out, a value the
// trace shortened ("abc...(43 chars)") is filled back to its length, and
// the spawned executable is this program. Each response must match the
// recorded one: the same command, success or failure, and the same
// fields, except job ids (learnt) and values that describe the recording
// machine (PMI_hwloc_xmlfile). A value read back must be the one put —
// by this job, or pre-put by its spawner — and a child's arguments must
// be those its parent's spawn request gave. The trace is named in the
// environment, which the children inherit from the launcher. It prints "replay ok conv N"
// or reports the first difference on stderr and exits 1.
package main

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/fastpmi/fastpmi/internal/pmitrace"
	"github.com/fastpmi/fastpmi/pmiwire"
)

func main() {
	trace := os.Getenv("TRACERANK_TRACE")
	if trace == "" {
		fmt.Fprintln(os.Stderr, "usage: TRACERANK_TRACE=TRACE tracerank")
		os.Exit(2)
	}
	conv, err := run(trace)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tracerank: conv %d: %v\n", conv, err)
		os.Exit(1)
	}
	fmt.Printf("replay ok conv %d\n", conv)
}

// msg is one recorded message, its shortened values respaced (see
// elision).
type msg = pmitrace.Msg

var (
	// elision is a shortened value, "abc...(43chars)" once readTrace has
	// taken the space out of the recording's "abc...(43 chars)" (PMI-1
	// values end at a space).
	elision = regexp.MustCompile(`^(.*)\.\.\.\((\d+)chars\)$`)
	spaced  = regexp.MustCompile(`\.\.\.\((\d+) chars\)`)
)

// readTrace reads a trace's conversations.
func readTrace(path string) ([][]msg, error) {
	convs, err := pmitrace.Read(path)
	for _, c := range convs {
		for i := range c {
			c[i].Text = spaced.ReplaceAllString(c[i].Text, "...(${1}chars)")
		}
	}
	return convs, err
}

// fill restores a shortened value: its prefix, padded to its length.
func fill(v string) string {
	sm := elision.FindStringSubmatch(v)
	if sm == nil {
		return v
	}
	n, _ := strconv.Atoi(sm[2])
	if n <= len(sm[1]) {
		return sm[1][:n]
	}
	return sm[1] + strings.Repeat("x", n-len(sm[1]))
}

// replayer is one rank's replay.
type replayer struct {
	conn net.Conn
	dec  pmiwire.Decoder
	rd   []byte
	ids  map[string]string // recorded job id → this run's
	kvs  map[string]string // what this rank's job put (and was pre-put), by key
	// lastKey is the key of the last get sent (its response is next).
	lastKey string
}

func run(trace string) (int, error) {
	convs, err := readTrace(trace)
	if err != nil {
		return 0, err
	}
	ci := 0
	if os.Getenv("PMI_SPAWNED") == "1" {
		r, err := strconv.Atoi(os.Getenv("PMI_RANK"))
		if err != nil {
			return 0, fmt.Errorf("PMI_RANK: %v", err)
		}
		ci = 1 + r
	}
	if ci >= len(convs) {
		return ci, fmt.Errorf("the trace has %d conversations", len(convs))
	}
	fd, err := strconv.Atoi(os.Getenv("PMI_FD"))
	if err != nil {
		return ci, fmt.Errorf("PMI_FD: %v", err)
	}
	conn, err := net.FileConn(os.NewFile(uintptr(fd), "pmi"))
	if err != nil {
		return ci, err
	}
	defer conn.Close()
	r := &replayer{conn: conn, ids: map[string]string{}, kvs: map[string]string{}, rd: make([]byte, 64<<10)}
	// What the job can read: its own puts and, for children, the spawner's
	// pre-put keys (in the first conversation's spawn request).
	jobConvs := convs[1:]
	if ci == 0 {
		jobConvs = convs[:1]
	}
	for _, c := range jobConvs {
		for _, m := range c {
			if m.Sent {
				r.notePut(m)
			}
		}
	}
	if ci > 0 {
		for _, m := range convs[0] {
			if m.Sent {
				if err := r.notePreput(m); err != nil {
					return ci, err
				}
			}
		}
	}
	for _, m := range convs[ci] {
		if m.Sent {
			err = r.send(m)
		} else {
			err = r.expect(m)
		}
		if err != nil {
			return ci, fmt.Errorf("trace line %d: %v", m.Line, err)
		}
	}
	return ci, nil
}

// decode parses a recorded message.
func decode(m msg) (pmiwire.Msg, error) {
	var d pmiwire.Decoder
	switch {
	case m.V2:
		d.Feed([]byte(fmt.Sprintf("%-6d%s", len(m.Text), m.Text)))
	case strings.HasPrefix(m.Text, "mcmd="):
		d.Feed([]byte(m.Text))
	default:
		d.Feed([]byte(m.Text + "\n"))
	}
	pm, ok, err := d.Next()
	if err == nil && !ok {
		err = fmt.Errorf("incomplete message %q", m.Text)
	}
	return pm, err
}

func (r *replayer) notePut(m msg) {
	pm, err := decode(m)
	if err != nil {
		return
	}
	switch pm.Cmd {
	case "put", "kvs-put", "info-putnodeattr":
		k, _ := pm.Get("key")
		v, _ := pm.Get("value")
		r.kvs[k] = fill(v)
	}
}

// notePreput notes the spawner's pre-put keys, and checks that this
// child got the arguments the spawn request gave.
func (r *replayer) notePreput(m msg) error {
	pm, err := decode(m)
	if err != nil || pm.Cmd != "spawn" {
		return nil
	}
	sp, err := pmiwire.ParseSpawn(&pm)
	if err != nil {
		return err
	}
	for _, p := range sp.Preput {
		r.kvs[p.Key] = fill(p.Val)
	}
	if got, want := strings.Join(os.Args[1:], " "), strings.Join(sp.Cmds[0].Args, " "); got != want {
		return fmt.Errorf("spawned with arguments %q, want %q", got, want)
	}
	return nil
}

// send writes a recorded request with this run's job ids, restored
// values and this program as the spawned executable.
func (r *replayer) send(m msg) error {
	pm, err := decode(m)
	if err != nil {
		return err
	}
	fix := func(ps []pmiwire.Pair) {
		for i := range ps {
			switch ps[i].Key {
			case "kvsname", "jobid":
				if id, ok := r.ids[ps[i].Val]; ok {
					ps[i].Val = id
				}
			case "execname", "subcmd":
				ps[i].Val = os.Args[0]
			default:
				ps[i].Val = fill(ps[i].Val)
			}
		}
	}
	switch pm.Cmd {
	case "get", "kvs-get", "info-getnodeattr", "info-getjobattr":
		r.lastKey, _ = pm.Get("key")
	}
	var wire []byte
	switch {
	case pm.Framing == pmiwire.V2:
		fix(pm.Pairs)
		wire = pmiwire.AppendRequestV2(nil, pm.Cmd, pm.Pairs...)
	case len(pm.Segments) > 0:
		for _, seg := range pm.Segments {
			fix(seg)
			if len(seg) == 0 || seg[0].Key != "mcmd" {
				wire = append(wire, "mcmd=spawn\n"...)
			}
			for _, p := range seg {
				wire = append(wire, p.Key+"="+p.Val+"\n"...)
			}
			wire = append(wire, "endcmd\n"...)
		}
	default:
		fix(pm.Pairs)
		wire = pmiwire.AppendV1(nil, pm.Cmd, pm.Pairs...)
	}
	_, err = r.conn.Write(wire)
	return err
}

// next reads one message from the agent.
func (r *replayer) next() (pmiwire.Msg, error) {
	for {
		m, ok, err := r.dec.Next()
		if err != nil || ok {
			return m, err
		}
		n, err := r.conn.Read(r.rd)
		if n > 0 {
			r.dec.Feed(r.rd[:n])
		}
		if err != nil {
			return pmiwire.Msg{}, fmt.Errorf("read: %v", err)
		}
	}
}

// expect reads the agent's response and compares it with the recorded one.
func (r *replayer) expect(want msg) error {
	wm, err := decode(want)
	if err != nil {
		return err
	}
	got, err := r.next()
	if err != nil {
		return err
	}
	if got.Cmd != wm.Cmd {
		return fmt.Errorf("response %s, want %s (%q)", got.Cmd, wm.Cmd, want.Text)
	}
	if isGet[got.Cmd] && notFound(&wm) {
		// A missing key: servers say so with rc≠0 (Hydra) or with found=
		// FALSE (Slurm); MPICH's clients take either.
		if !notFound(&got) {
			return fmt.Errorf("%s found a key the recording did not", got.Cmd)
		}
		return nil
	}
	rcGot, _ := got.Get("rc")
	rcWant, hasRC := wm.Get("rc")
	if hasRC && (rcGot == "0") != (rcWant == "0") {
		return fmt.Errorf("%s rc=%s, want rc=%s", got.Cmd, rcGot, rcWant)
	}
	for _, p := range wm.Pairs {
		g, ok := got.Get(p.Key)
		switch p.Key {
		case "cmd", "rc", "thrid":
			continue
		case "kvsname", "jobid":
			if !ok {
				return fmt.Errorf("%s without %s", got.Cmd, p.Key)
			}
			r.ids[p.Val] = g
			continue
		case "spawner-jobid":
			if !ok {
				return fmt.Errorf("%s without spawner-jobid: the child does not know it was spawned", got.Cmd)
			}
			continue
		case "pmiverbose":
			continue
		case "pmi_subversion":
			// fastpmi answers PMI 1.2 to a 1.1 client, as Hydra 4.0 does
			// (group barriers); the client takes any 1.x at least its own.
			if n, err := strconv.Atoi(g); err != nil || g < p.Val || n > 2 {
				return fmt.Errorf("%s pmi_subversion=%q, want %s..2", got.Cmd, g, p.Val)
			}
			continue
		}
		if !ok && p.Key == "found" && got.Framing == pmiwire.V1 {
			continue // optional in PMI-1 (Hydra 4.1 and later add it)
		}
		if !ok {
			return fmt.Errorf("%s lacks %s (want %q)", got.Cmd, p.Key, p.Val)
		}
		if p.Key == "value" {
			if p.Val == "<hwloc-xml-file>" {
				continue // describes the recording machine
			}
			if w := r.readBack(p.Val); g != w {
				return fmt.Errorf("%s value %q, want %q", got.Cmd, g, w)
			}
			continue
		}
		if g != p.Val {
			return fmt.Errorf("%s %s=%q, want %q", got.Cmd, p.Key, g, p.Val)
		}
	}
	return nil
}

// isGet marks the responses to reads of a key.
var isGet = map[string]bool{"get_result": true, "kvs-get-response": true, "info-getjobattr-response": true, "info-getnodeattr-response": true}

// notFound reports whether a read's response says the key is missing.
func notFound(m *pmiwire.Msg) bool {
	rc, _ := m.Get("rc")
	f, _ := m.Get("found")
	return rc != "0" || f == "FALSE"
}

// readBack is the value a get should return: a shortened recorded value
// stands for what was put under the key asked for.
func (r *replayer) readBack(recorded string) string {
	if elision.MatchString(recorded) {
		if v, ok := r.kvs[r.lastKey]; ok {
			return v
		}
		return fill(recorded)
	}
	return recorded
}
