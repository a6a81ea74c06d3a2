// Package pmitrace reads the recorded PMI conversations of
// pmiwire/testdata/traces (see its README.md): one file per recording,
// one "=== pid" section per rank, one "> " line per message the rank sent
// and "< " per message it received. PMI-2 frames are shown as "[v2
// len=N] body"; the lines of a PMI-1 spawn block (mcmd=spawn … endcmd,
// possibly several segments) are one message. Long values are shortened
// in the recordings ("abc...(43 chars)"), and an hwloc topology is shown
// as <hwloc-xml-file>: such messages are marked Edited.
package pmitrace

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Msg is one recorded message.
type Msg struct {
	Line   int    // line number in the trace file
	Sent   bool   // '>' (rank to server) rather than '<'
	V2     bool   // PMI-2 frame
	Length int    // announced body length of a PMI-2 frame
	Edited bool   // a value was shortened or replaced: Length not checkable
	Text   string // PMI-1 line without LF, PMI-1 spawn block with its LFs, or PMI-2 body
}

var v2Line = regexp.MustCompile(`^\[v2 len=(\d+)\] (.*)$`)

// Read splits a trace file into its conversations.
func Read(path string) ([][]Msg, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var convs [][]Msg
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
		m := Msg{Line: n, Sent: trim[0] == '>', Text: trim[2:]}
		cur := &convs[len(convs)-1]
		if inBlock {
			last := &(*cur)[len(*cur)-1]
			last.Text += m.Text + "\n"
			// A block goes on after "endcmd" only if another segment
			// follows; the decision is taken when the next line arrives.
			if m.Text == "endcmd" {
				inBlock = false
			}
			continue
		}
		if m.Sent && strings.HasPrefix(m.Text, "mcmd=") && len(*cur) > 0 {
			if last := &(*cur)[len(*cur)-1]; strings.HasSuffix(last.Text, "endcmd\n") {
				last.Text += m.Text + "\n" // next segment of the same block
				inBlock = true
				continue
			}
		}
		if m.Sent && strings.HasPrefix(m.Text, "mcmd=") {
			m.Text += "\n"
			inBlock = true
		}
		if sm := v2Line.FindStringSubmatch(m.Text); sm != nil {
			m.V2 = true
			m.Length, _ = strconv.Atoi(sm[1])
			m.Text = sm[2]
		}
		m.Edited = strings.Contains(m.Text, "...(") || strings.Contains(m.Text, "<hwloc-xml-file>") ||
			(m.V2 && strings.HasPrefix(m.Text, "cmd=spawn;")) // see testdata/traces/README.md
		*cur = append(*cur, m)
	}
	return convs, sc.Err()
}
