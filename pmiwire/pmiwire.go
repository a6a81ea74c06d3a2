// Package pmiwire is the codec of the PMI-1 and PMI-2 text wire protocols
// that MPICH's simple PMI client and Slurm's libpmi2 speak to a process
// manager (see pmi-wire.md in the project's shared documents).
//
// The package is pure: it does no I/O and keeps no clocks or goroutines.
// A Decoder is fed the bytes read from one connection and yields whole
// requests; Append functions format responses into a caller's buffer.
//
// Framing is decided per message, as Hydra does: a message that starts
// with "cmd=" or "mcmd=" is a PMI-1 line (or a multi-line PMI-1 spawn
// block), anything else is a PMI-2 frame with a 6-byte ASCII length header
// padded with spaces on either side.
//
// A Decoder owns its buffer and is used by one goroutine. Msg values it
// returns own their strings (they are copied out of the buffer) and stay
// valid after the next Feed. A malformed request body is reported as a
// *SyntaxError after the request has been consumed, so the caller answers it
// and goes on; a request too long or a PMI-2 length header that cannot be
// read loses the framing, and the decoder then reports that error for ever.
//
// The encoders never produce bytes that break the framing: PMI-1 tokens have
// spaces and line feeds replaced, PMI-2 values have ';' doubled.
package pmiwire

import (
	"errors"
	"fmt"
	"strconv"
)

// Limits announced to clients by get_maxes and enforced by the agent.
// KeyLenMax and ValLenMax are the job's size limits, whatever path a
// rank takes: the shared-memory segment's defaults (shm.DefaultKVSKeyMax,
// shm.DefaultMaxValue) and the agent tree's (tree.JobLimits) derive from
// them, and nothing else states them.
const (
	KVSNameMax = 256  // kvsname_max
	KeyLenMax  = 64   // keylen_max
	ValLenMax  = 1024 // vallen_max
)

// MaxMessage bounds one request (a PMI-1 line without its LF, a whole PMI-1
// spawn block, or a PMI-2 frame body). Larger requests are rejected with
// ErrTooLong and the connection must be closed, since framing is lost.
const MaxMessage = 64 << 10

// MaxFrame is the largest PMI-2 body the 6-digit length header can announce.
const MaxFrame = 999999

// PMI error codes used in responses (RFC 13, Slurm pmi.h).
const (
	RCSuccess          = 0
	RCFail             = -1
	RCInit             = 1
	RCInvalidArg       = 3
	RCInvalidKey       = 4
	RCInvalidKeyLength = 5
	RCInvalidValLength = 7
	RCOther            = 14
)

// Framing says which protocol framing a message used; responses are sent
// with the framing of the request they answer.
type Framing uint8

const (
	V1 Framing = 1 // PMI-1: "cmd=name k=v k=v\n"
	V2 Framing = 2 // PMI-2: 6-byte length header, "cmd=name;k=v;...;"
)

func (f Framing) String() string {
	switch f {
	case V1:
		return "PMI-1"
	case V2:
		return "PMI-2"
	}
	return "framing(" + strconv.Itoa(int(f)) + ")"
}

// Pair is one key/value field. Order and duplicates are preserved because
// they are significant in spawn requests.
type Pair struct {
	Key, Val string
	// NoVal is set for a PMI-1 key written without '=' (e.g. "endcmd").
	NoVal bool
}

// Msg is one decoded request.
type Msg struct {
	Framing Framing
	// Cmd is the command name: "init", "get", "kvs-put", ... For a PMI-1
	// multi-line spawn block Cmd is "spawn" and Segments holds the fields of
	// each "mcmd=spawn ... endcmd" segment, in order.
	Cmd      string
	Pairs    []Pair
	Segments [][]Pair
}

// Get returns the value of the first field named key. An empty value is
// reported as absent (clients send "jobid=;" for NULL).
func (m *Msg) Get(key string) (string, bool) {
	return lookup(m.Pairs, key)
}

// Has reports whether a field named key is present, even with an empty value.
func (m *Msg) Has(key string) bool {
	for _, p := range m.Pairs {
		if p.Key == key {
			return true
		}
	}
	return false
}

// Lookup returns the value of the first field named key in pairs; empty
// values are absent.
func Lookup(pairs []Pair, key string) (string, bool) { return lookup(pairs, key) }

func lookup(pairs []Pair, key string) (string, bool) {
	for _, p := range pairs {
		if p.Key == key {
			if p.Val == "" {
				return "", false
			}
			return p.Val, true
		}
	}
	return "", false
}

// Errors reported by the decoder. A *SyntaxError describes a request that
// was framed correctly but whose body is malformed: the connection stays
// usable and the caller should answer it with rc≠0. ErrTooLong and
// ErrBadHeader mean framing is lost; the decoder returns them wrapped with
// the offending length or header, so test them with errors.Is.
var (
	ErrTooLong   = errors.New("pmiwire: request exceeds maximum message size")
	ErrBadHeader = errors.New("pmiwire: malformed PMI-2 length header")
)

// SyntaxError is a malformed request body (from the Decoder) or a spawn
// request whose fields do not add up (from ParseSpawn). Cmd is the command
// name when it could be read (so the caller can name its response), else "".
type SyntaxError struct {
	Framing Framing
	Cmd     string
	Reason  string
	// Fields are the request's fields read before the error (Cmd set):
	// enough to act on a request that gets no reply (abort).
	Fields []Pair
}

func (e *SyntaxError) Error() string {
	if e.Cmd == "" {
		return fmt.Sprintf("pmiwire: malformed %v request: %s", e.Framing, e.Reason)
	}
	return fmt.Sprintf("pmiwire: malformed %v %q request: %s", e.Framing, e.Cmd, e.Reason)
}
