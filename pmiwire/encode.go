package pmiwire

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Resp builds one response. Fields are written in the order added; the
// caller adds rc first (clients look fields up by name, but Flux-style
// parsers take msg/value to the end of a PMI-1 line, so those go last).
type Resp struct {
	Framing Framing
	Cmd     string // response name, e.g. "get_result" or "kvs-get-response"
	Pairs   []Pair
	room    [4]Pair // Pairs' first storage: most responses have 2-4 fields
}

// NewResp starts a response named cmd with the given framing.
func NewResp(f Framing, cmd string) *Resp {
	r := &Resp{Framing: f, Cmd: cmd}
	r.Pairs = r.room[:0]
	return r
}

// Add appends a field.
func (r *Resp) Add(key, val string) *Resp {
	r.Pairs = append(r.Pairs, Pair{Key: key, Val: val})
	return r
}

// AddInt appends an integer field.
func (r *Resp) AddInt(key string, v int) *Resp { return r.Add(key, strconv.Itoa(v)) }

// AddBool appends a TRUE/FALSE field.
func (r *Resp) AddBool(key string, v bool) *Resp {
	if v {
		return r.Add(key, "TRUE")
	}
	return r.Add(key, "FALSE")
}

// Append formats the response onto dst, growing it once to the size the
// response takes without escapes.
func (r *Resp) Append(dst []byte) []byte {
	n := len("      cmd=;\n") + len(r.Cmd)
	for _, p := range r.Pairs {
		n += len(p.Key) + len(p.Val) + 2
	}
	dst = slices.Grow(dst, n)
	if r.Framing == V2 {
		return AppendV2(dst, r.Cmd, r.Pairs...)
	}
	return AppendV1(dst, r.Cmd, r.Pairs...)
}

// AppendV1 formats a PMI-1 line "cmd=name k=v ...\n". Values cannot carry
// spaces, LF or NUL in PMI-1; they are replaced by '_' (as Slurm does for
// its messages), in the command name and keys too, and '=' in a key as
// well, so a line can never break the framing. A CR ending the line is
// replaced too, since a reader takes it for a CRLF line end; tabs and
// other CRs travel as they are, as Hydra sends them.
func AppendV1(dst []byte, cmd string, pairs ...Pair) []byte {
	dst = append(dst, "cmd="...)
	dst = appendV1Token(dst, cmd, false)
	for _, p := range pairs {
		dst = append(dst, ' ')
		dst = appendV1Token(dst, p.Key, true)
		if p.NoVal {
			continue
		}
		dst = append(dst, '=')
		dst = appendV1Token(dst, p.Val, false)
	}
	if dst[len(dst)-1] == '\r' {
		dst[len(dst)-1] = '_'
	}
	return append(dst, '\n')
}

func appendV1Token(dst []byte, s string, key bool) []byte {
	start := len(dst)
	dst = append(dst, s...)
	for i := start; i < len(dst); i++ {
		if c := dst[i]; c == ' ' || c == '\n' || c == 0 || (key && c == '=') {
			dst[i] = '_'
		}
	}
	return dst
}

// AppendV2 formats a PMI-2 frame: a 6-byte left-aligned length header and
// "cmd=name;k=v;...;". A ';' inside a value or the name is doubled (the
// documented escape; callers should avoid it, since MPICH does not
// un-escape); '=' and ';' in a key are replaced by '_'. A body longer than
// MaxFrame cannot be announced by the header: the frame is then replaced by
// "cmd=<name>;rc=-1;errmsg=response too long (N bytes, ...);" so that the
// peer still gets a well-framed answer that says why.
func AppendV2(dst []byte, cmd string, pairs ...Pair) []byte {
	start := len(dst)
	dst = append(dst, "      cmd="...)
	dst = appendV2Value(dst, cmd)
	dst = append(dst, ';')
	for _, p := range pairs {
		for i := 0; i < len(p.Key); i++ {
			c := p.Key[i]
			if c == '=' || c == ';' {
				c = '_'
			}
			dst = append(dst, c)
		}
		dst = append(dst, '=')
		dst = appendV2Value(dst, p.Val)
		dst = append(dst, ';')
	}
	n := len(dst) - start - 6
	if n > MaxFrame {
		if len(cmd) > KVSNameMax {
			cmd = "error-response"
		}
		return AppendV2(dst[:start], cmd, Pair{Key: "rc", Val: strconv.Itoa(RCFail)},
			Pair{Key: "errmsg", Val: fmt.Sprintf("response too long (%d bytes, over the %d a PMI-2 frame holds)", n, MaxFrame)})
	}
	hdr := strconv.AppendInt(dst[start:start], int64(n), 10)
	for i := len(hdr); i < 6; i++ {
		dst[start+i] = ' '
	}
	return dst
}

func appendV2Value(dst []byte, s string) []byte {
	for {
		i := strings.IndexByte(s, ';')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i+1]...)
		dst = append(dst, ';')
		s = s[i+1:]
	}
}

// AppendRequestV2 formats a PMI-2 request with MPICH's right-aligned header
// ("%6u"); used by test clients.
func AppendRequestV2(dst []byte, cmd string, pairs ...Pair) []byte {
	start := len(dst)
	dst = AppendV2(dst, cmd, pairs...)
	n := len(dst) - start - 6
	s := strconv.Itoa(n)
	hdr := dst[start : start+6]
	for i := range hdr {
		hdr[i] = ' '
	}
	copy(hdr[6-len(s):], s)
	return dst
}

// ResponseName returns the name of the response to a request command, so
// that even an unknown or malformed request gets a matching reply.
func ResponseName(f Framing, cmd string) string {
	if f == V2 {
		if r, ok := v2Responses[cmd]; ok {
			return r
		}
		if !isWord(cmd) {
			return "error-response"
		}
		return cmd + "-response"
	}
	if r, ok := v1Responses[cmd]; ok {
		return r
	}
	if !isWord(cmd) {
		return "error"
	}
	return cmd + "_result"
}

// isWord reports whether a command name can be echoed in a response name:
// not empty, printable ASCII without the framing's separators (a client's
// garbage is not sent back to it, NUL bytes and escape sequences
// included).
func isWord(cmd string) bool {
	if cmd == "" {
		return false
	}
	for i := 0; i < len(cmd); i++ {
		if c := cmd[i]; c <= ' ' || c >= 0x7f || c == '=' || c == ';' {
			return false
		}
	}
	return true
}

// v2Responses holds the PMI-2 commands' response names, made once: the
// name is cmd + "-response", and a request is answered often.
var v2Responses = func() map[string]string {
	m := make(map[string]string)
	for _, cmd := range []string{"fullinit", "finalize", "abort", "job-getid", "job-connect", "job-disconnect",
		"kvs-put", "kvs-fence", "kvs-get", "info-getnodeattr", "info-putnodeattr", "info-getjobattr",
		"name-publish", "name-unpublish", "name-lookup", "spawn", "ring"} {
		m[cmd] = cmd + "-response"
	}
	return m
}()

var v1Responses = map[string]string{
	"init":              "response_to_init",
	"initack":           "initack",
	"get_maxes":         "maxes",
	"get_appnum":        "appnum",
	"get_universe_size": "universe_size",
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
}
