package pmiwire

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// maxRetain is the buffer capacity a Decoder keeps between requests; a
// larger buffer (left by a burst of pipelined requests) is released once it
// has been drained.
const maxRetain = 2 * MaxMessage

// Decoder reassembles requests from the byte stream of one connection.
// Requests may arrive split across Feed calls or several in one; the
// sequence of results does not depend on how the stream was split. The zero
// Decoder is ready to use.
type Decoder struct {
	// FrameLimit bounds a PMI-2 frame body; 0 means MaxMessage. A client
	// reading fastpmi's large responses (all values of an allgather) may
	// raise it up to MaxFrame.
	FrameLimit int

	// buf[off:] holds the bytes not decoded yet; buf[:off] is spent and
	// reclaimed by Feed and Fill. scan counts the bytes at the start of
	// buf[off:] known to hold no LF, so that a line arriving a byte at a
	// time is scanned once rather than once per byte.
	buf  []byte
	off  int
	scan int

	// A PMI-1 spawn block is decoded line by line as it arrives. inSeg is
	// set once the "mcmd=" line of a segment has been read; segCmd is its
	// value, seg the fields read since and segBad the first defect found in
	// them (reported when the segment ends, so that framing is kept).
	// spawn holds the finished segments of the block, total the totspawns
	// of its first segment, and blockLen the bytes of the block consumed so
	// far, which MaxMessage bounds.
	inSeg    bool
	segCmd   string
	seg      []Pair
	segBad   string
	spawn    [][]Pair
	total    int
	blockLen int

	err error // sticky framing error, wrapping ErrTooLong or ErrBadHeader
}

// fillSpace is the free room Fill offers a read: a request of the usual
// size arrives whole in one read.
const fillSpace = 4 << 10

// Fill reads once from r straight into the decoder's buffer (what Feed
// would do with a buffer of the caller's, without that buffer and its
// copy) and reports how many bytes it added. The buffer holds fillSpace
// bytes while the connection is idle, not a read buffer as well.
func (d *Decoder) Fill(r io.Reader) (int, error) {
	if cap(d.buf)-len(d.buf) < fillSpace {
		d.compact()
		d.buf = slices.Grow(d.buf, fillSpace)
	}
	n, err := r.Read(d.buf[len(d.buf):cap(d.buf)])
	d.buf = d.buf[:len(d.buf)+n]
	return n, err
}

// compact moves the bytes not decoded yet to the start of the buffer.
func (d *Decoder) compact() {
	if d.off > 0 {
		n := copy(d.buf, d.buf[d.off:])
		d.buf = d.buf[:n]
		d.off = 0
	}
}

// Feed appends bytes read from the connection. The decoder copies p.
func (d *Decoder) Feed(p []byte) {
	if len(d.buf)+len(p) > cap(d.buf) {
		d.compact()
	}
	d.buf = append(d.buf, p...)
}

// Buffered reports how many received bytes belong to no request returned
// yet: bytes not decoded plus the part of a PMI-1 spawn block already read.
func (d *Decoder) Buffered() int { return len(d.buf) - d.off + d.blockLen }

// Next returns the next whole request. ok is false when more bytes are
// needed. A *SyntaxError consumes the bad request and the decoder stays
// usable; errors wrapping ErrTooLong or ErrBadHeader are sticky.
func (d *Decoder) Next() (m Msg, ok bool, err error) {
	if d.err != nil {
		return Msg{}, false, d.err
	}
	if !d.inSeg {
		d.skipLF() // some clients flush a stray "\n" between messages
	}
	b := d.buf[d.off:]
	inBlock := d.inSeg || len(d.spawn) > 0
	switch {
	case len(b) == 0 && !inBlock:
		return Msg{}, false, nil
	case inBlock || hasPrefixPartial(b, "mcmd="):
		return d.nextSpawn()
	case hasPrefixPartial(b, "cmd="):
		if len(b) < len("cmd=") {
			return Msg{}, false, nil
		}
		line, ok := d.line(MaxMessage, "PMI-1 line")
		if !ok {
			return Msg{}, false, d.err
		}
		m, err := parseV1Line(line)
		if err != nil {
			return Msg{}, false, err
		}
		return m, true, nil
	}
	return d.nextV2()
}

// fail records a sticky framing error.
func (d *Decoder) fail(err error) (Msg, bool, error) {
	d.err = err
	return Msg{}, false, err
}

func (d *Decoder) consume(n int) {
	if n == 0 {
		return
	}
	d.off += n
	d.scan = 0
	if d.off == len(d.buf) {
		d.off = 0
		if cap(d.buf) > maxRetain {
			d.buf = nil
		} else {
			d.buf = d.buf[:0]
		}
	}
}

func (d *Decoder) skipLF() {
	b := d.buf[d.off:]
	i := 0
	for i < len(b) && b[i] == '\n' {
		i++
	}
	d.consume(i)
}

// line returns the next line without its LF and consumes it. The slice
// aliases the buffer and is valid until the next Feed. ok is false when the
// line is incomplete, or when it is longer than limit bytes: then d.err is
// set, naming what (a line or a spawn block) is too long.
func (d *Decoder) line(limit int, what string) (line []byte, ok bool) {
	b := d.buf[d.off:]
	i := bytes.IndexByte(b[d.scan:], '\n')
	if i < 0 {
		d.scan = len(b)
		if len(b) > limit {
			d.err = fmt.Errorf("read %s longer than %d bytes: %w", what, MaxMessage, ErrTooLong)
		}
		return nil, false
	}
	i += d.scan
	if i > limit {
		d.err = fmt.Errorf("read %s longer than %d bytes: %w", what, MaxMessage, ErrTooLong)
		return nil, false
	}
	line = b[:i]
	d.consume(i + 1)
	return line, true
}

// hasPrefixPartial reports whether b starts with prefix or is a prefix of it.
func hasPrefixPartial(b []byte, prefix string) bool {
	n := min(len(b), len(prefix))
	return string(b[:n]) == prefix[:n]
}

func (d *Decoder) nextV2() (Msg, bool, error) {
	b := d.buf[d.off:]
	if len(b) < 6 {
		for _, c := range b {
			if c != ' ' && (c < '0' || c > '9') {
				return d.fail(fmt.Errorf("read PMI-2 length header %q: %w", b, ErrBadHeader))
			}
		}
		return Msg{}, false, nil
	}
	n, ok := parseHeader(b[:6])
	if !ok {
		return d.fail(fmt.Errorf("read PMI-2 length header %q: %w", b[:6], ErrBadHeader))
	}
	limit := MaxMessage
	if d.FrameLimit > 0 {
		limit = min(d.FrameLimit, MaxFrame)
	}
	if n > limit {
		return d.fail(fmt.Errorf("read PMI-2 frame of %d bytes (limit %d): %w", n, limit, ErrTooLong))
	}
	if len(b) < 6+n {
		return Msg{}, false, nil
	}
	m, err := parseV2Body(b[6 : 6+n])
	d.consume(6 + n)
	if err != nil {
		return Msg{}, false, err
	}
	return m, true, nil
}

// parseHeader reads the 6-byte length: decimal digits with spaces on
// either side (MPICH pads left, Slurm pads right), nothing else.
func parseHeader(h []byte) (int, bool) {
	i := 0
	for i < len(h) && h[i] == ' ' {
		i++
	}
	n, digits := 0, 0
	for ; i < len(h) && h[i] >= '0' && h[i] <= '9'; i++ {
		n = n*10 + int(h[i]-'0')
		digits++
	}
	for ; i < len(h); i++ {
		if h[i] != ' ' {
			return 0, false
		}
	}
	return n, digits > 0
}

// isV1Space reports whether c separates PMI-1 fields: a space, as every
// client writes them and every server (MPICH's parser, Hydra, Slurm) reads
// them. A tab or CR is part of its value, as it is there.
func isV1Space(c byte) bool { return c == ' ' }

// parseV1Line parses "cmd=name k=v k k=v" (without the LF; CRs before the
// LF are dropped). The caller guarantees the line starts with "cmd=".
func parseV1Line(line []byte) (Msg, error) {
	s := strings.TrimRight(string(line), "\r")
	nsep := 0
	for i := 0; i < len(s); i++ {
		if isV1Space(s[i]) {
			nsep++
		}
	}
	m := Msg{Framing: V1}
	first := true
	i := 0
	for i < len(s) {
		for i < len(s) && isV1Space(s[i]) {
			i++
		}
		j := i
		for j < len(s) && !isV1Space(s[j]) {
			j++
		}
		f := s[i:j]
		i = j
		if f == "" {
			break
		}
		if first {
			first = false
			m.Cmd = f[len("cmd="):]
			if m.Cmd == "" {
				return Msg{}, &SyntaxError{Framing: V1, Reason: "empty command name"}
			}
			if strings.IndexByte(m.Cmd, 0) >= 0 {
				return Msg{}, &SyntaxError{Framing: V1, Reason: "NUL byte in command name"}
			}
			m.Pairs = make([]Pair, 0, nsep)
			continue
		}
		k, v, hasEq := strings.Cut(f, "=")
		if k == "" {
			return Msg{}, &SyntaxError{Framing: V1, Cmd: m.Cmd, Reason: "field with empty key", Fields: soFar(m.Pairs)}
		}
		if strings.IndexByte(f, 0) >= 0 {
			return Msg{}, &SyntaxError{Framing: V1, Cmd: m.Cmd, Reason: "NUL byte in field " + strconv.Quote(k), Fields: soFar(m.Pairs)}
		}
		m.Pairs = append(m.Pairs, Pair{Key: k, Val: v, NoVal: !hasEq})
	}
	if len(m.Pairs) == 0 {
		m.Pairs = nil
	}
	return m, nil
}

// nextSpawn decodes a PMI-1 "mcmd=spawn" block: one segment per
// executable, each a "mcmd=spawn" line, "key=value" lines whose values run
// to the end of the line (spaces included), and an "endcmd" line. The block
// ends with the segment whose spawnssofar equals its totspawns and is
// returned as one Msg with Cmd "spawn" and the fields of each segment (the
// mcmd line left out) in Segments.
func (d *Decoder) nextSpawn() (Msg, bool, error) {
	for {
		if !d.inSeg {
			d.skipLF()
			b := d.buf[d.off:]
			if len(b) == 0 {
				return Msg{}, false, nil
			}
			if !hasPrefixPartial(b, "mcmd=") {
				// Only reachable between segments of an unfinished block.
				got, want := len(d.spawn), d.total
				d.resetSpawn()
				return Msg{}, false, &SyntaxError{Framing: V1, Cmd: "spawn",
					Reason: fmt.Sprintf("spawn block ends after %d of %d segments", got, want)}
			}
			if len(b) < len("mcmd=") {
				return Msg{}, false, nil
			}
		}
		raw, ok := d.line(MaxMessage-d.blockLen-1, "PMI-1 spawn block")
		if !ok {
			return Msg{}, false, d.err
		}
		d.blockLen += len(raw) + 1
		s := strings.TrimRight(string(raw), "\r")
		if !d.inSeg {
			d.inSeg = true
			d.segCmd = strings.Trim(s[len("mcmd="):], " \t")
			continue
		}
		word := strings.Trim(s, " \t")
		if word == "" {
			continue
		}
		if word != "endcmd" {
			k, v, hasEq := strings.Cut(s, "=")
			k = strings.Trim(k, " \t")
			if k == "" && d.segBad == "" {
				d.segBad = "line with empty key"
			}
			d.seg = append(d.seg, Pair{Key: k, Val: v, NoVal: !hasEq})
			continue
		}
		m, ok, err := d.endSegment()
		if ok || err != nil {
			return m, ok, err
		}
	}
}

// endSegment files the segment just ended by "endcmd". It returns the whole
// block when this was its last segment, a *SyntaxError when the segment is
// malformed (dropping the block), and ok == false when segments follow.
func (d *Decoder) endSegment() (Msg, bool, error) {
	seg, name, bad := d.seg, d.segCmd, d.segBad
	d.inSeg, d.seg, d.segCmd, d.segBad = false, nil, "", ""
	bail := func(cmd, reason string) (Msg, bool, error) {
		d.resetSpawn()
		return Msg{}, false, &SyntaxError{Framing: V1, Cmd: cmd, Reason: reason}
	}
	if name != "spawn" {
		return bail(name, fmt.Sprintf("unknown multi-line command mcmd=%s", name))
	}
	if bad != "" {
		return bail("spawn", fmt.Sprintf("segment %d: %s", len(d.spawn)+1, bad))
	}
	tv, _ := lookup(seg, "totspawns")
	sv, _ := lookup(seg, "spawnssofar")
	t, terr := strconv.Atoi(tv)
	s, serr := strconv.Atoi(sv)
	if terr != nil || serr != nil || t < 1 || s < 1 || s > t {
		return bail("spawn", fmt.Sprintf("segment %d: bad totspawns=%q spawnssofar=%q", len(d.spawn)+1, tv, sv))
	}
	if len(d.spawn) == 0 {
		d.total = t
	}
	d.spawn = append(d.spawn, seg)
	if s < t {
		if len(d.spawn) >= t {
			return bail("spawn", fmt.Sprintf("segment %d of a block of totspawns=%d says spawnssofar=%d", len(d.spawn), t, s))
		}
		return Msg{}, false, nil
	}
	m := Msg{Framing: V1, Cmd: "spawn", Segments: d.spawn}
	d.resetSpawn()
	return m, true, nil
}

func (d *Decoder) resetSpawn() {
	d.spawn, d.total, d.blockLen = nil, 0, 0
}

// parseV2Body parses "cmd=name;k=v;k=v;". A ";;" inside a value (or the
// command name) is a literal ';' (Slurm's client escapes that way). A
// missing final ';' is tolerated. Values may contain '=' and spaces; keys
// are the bytes before the first '=' and may not contain ';'.
func parseV2Body(body []byte) (Msg, error) {
	s := string(body)
	m := Msg{Framing: V2}
	first := true
	for i := 0; i < len(s); {
		eq := strings.IndexByte(s[i:], '=')
		semi := strings.IndexByte(s[i:], ';')
		if eq < 0 || (semi >= 0 && semi < eq) {
			return Msg{}, &SyntaxError{Framing: V2, Cmd: m.Cmd, Reason: "field without '='", Fields: soFar(m.Pairs)}
		}
		key := s[i : i+eq]
		i += eq + 1
		var val string
		val, i = v2Value(s, i)
		if key == "" {
			return Msg{}, &SyntaxError{Framing: V2, Cmd: m.Cmd, Reason: "field with empty key", Fields: soFar(m.Pairs)}
		}
		if first {
			if key != "cmd" || val == "" {
				return Msg{}, &SyntaxError{Framing: V2, Reason: "body does not start with cmd=<name>"}
			}
			m.Cmd = val
			first = false
			m.Pairs = make([]Pair, 0, strings.Count(s[i:], "="))
			continue
		}
		m.Pairs = append(m.Pairs, Pair{Key: key, Val: val})
	}
	if first {
		return Msg{}, &SyntaxError{Framing: V2, Reason: "empty body"}
	}
	if len(m.Pairs) == 0 {
		m.Pairs = nil
	}
	return m, nil
}

// v2Value reads the value starting at s[i] up to its terminating ';' (or
// the end of s), un-escaping ";;", and returns it with the index after the
// terminator.
func v2Value(s string, i int) (string, int) {
	j := strings.IndexByte(s[i:], ';')
	if j < 0 {
		return s[i:], len(s)
	}
	if i+j+1 >= len(s) || s[i+j+1] != ';' {
		return s[i : i+j], i + j + 1 // common case: no escape, no copy
	}
	var b strings.Builder
	for i < len(s) {
		c := s[i]
		if c == ';' {
			if i+1 < len(s) && s[i+1] == ';' {
				b.WriteByte(';')
				i += 2
				continue
			}
			return b.String(), i + 1
		}
		b.WriteByte(c)
		i++
	}
	return b.String(), i
}

// soFar is a SyntaxError's Fields: the pairs read before it, nil if none.
func soFar(p []Pair) []Pair {
	if len(p) == 0 {
		return nil
	}
	return p
}
