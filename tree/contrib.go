package tree

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// Errors of the codecs and merges, wrapped with the details.
var (
	ErrMalformed = errors.New("malformed contribution")
	ErrLimit     = errors.New("contribution exceeds limits")
	ErrOrder     = errors.New("entries not in strictly increasing order")
	ErrConflict  = errors.New("entry contributed twice") // same rank or key from two parts
)

// Limits bound what a decoder accepts.
type Limits struct {
	Ranks    int // P: every rank and owner is below it
	MaxValue int // longest value in bytes (KV sets)
	MaxEntry int // longest value in bytes (entry sets)
	MaxKey   int // longest key in bytes (KV sets)
	MaxTotal int // longest encoding in bytes (a whole merged result included)
}

// MaxJobTotal bounds a job's merged tree result (JobLimits.MaxTotal),
// and with it what a node decompresses from one broadcast.
const MaxJobTotal = 1 << 31

// MaxNodeEntry bounds one allgather value (JobLimits.MaxEntry). A rank's
// own value is at most pmiwire.ValLenMax, but a PMIx node's collected data
// (every local client's committed data, agent/pmix) travels as the value
// of its first rank; 16 MiB is a quarter of a link's largest frame
// (netio.DefaultMaxFrameSize).
const MaxNodeEntry = 16 << 20

// JobLimits are the limits of the agent tree of a job of ranks ranks,
// at the root and at every node alike: keys and put values as long as a
// rank may put them (pmiwire.KeyLenMax, pmiwire.ValLenMax, the one
// statement of the job's size limits), allgather values as long as a
// node may contribute them (MaxNodeEntry) and merged results of at most
// MaxJobTotal bytes.
func JobLimits(ranks int) Limits {
	return Limits{Ranks: ranks, MaxValue: pmiwire.ValLenMax, MaxEntry: MaxNodeEntry, MaxKey: pmiwire.KeyLenMax, MaxTotal: MaxJobTotal}
}

func (l Limits) validate() error {
	if l.Ranks < 1 || l.MaxValue < 0 || l.MaxEntry < 0 || l.MaxKey < 1 || l.MaxTotal < 1 {
		return fmt.Errorf("check limits %+v: %w", l, ErrLimit)
	}
	return nil
}

// Entry is one rank's value in an allgather contribution.
type Entry struct {
	Rank  uint32
	Value []byte
}

// KV is one put of a fence: key and value, and the rank that put it.
type KV struct {
	Key   []byte
	Value []byte
	Owner uint32
}

// Encoding of an entry set:
//
//	tag 'c', version 1, uvarint count,
//	per entry: uvarint rank gap (first: rank; then rank - previous - 1),
//	           uvarint value length, value bytes
//
// and of a KV set:
//
//	tag 'k', version 1, uvarint count,
//	per entry: uvarint owner, uvarint key length, key, uvarint value length, value
//
// with keys in strictly increasing byte order.
const (
	tagEntries = 'c'
	tagKVs     = 'k'
	version    = 1
)

// SortEntries orders es by rank, as AppendEntries needs.
func SortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int { return cmp.Compare(a.Rank, b.Rank) })
}

// SortKVs orders kvs by key, as AppendKVs needs.
func SortKVs(kvs []KV) {
	slices.SortFunc(kvs, func(a, b KV) int { return bytes.Compare(a.Key, b.Key) })
}

// AppendEntries appends the encoding of es, which must be in strictly
// increasing rank order, to dst.
func AppendEntries(dst []byte, es []Entry) ([]byte, error) {
	dst = append(dst, tagEntries, version)
	dst = binary.AppendUvarint(dst, uint64(len(es)))
	next := uint64(0) // smallest rank the next entry may have
	for i, e := range es {
		if uint64(e.Rank) < next {
			return dst, fmt.Errorf("encode entry %d (rank %d): %w", i, e.Rank, ErrOrder)
		}
		dst = binary.AppendUvarint(dst, uint64(e.Rank)-next)
		dst = binary.AppendUvarint(dst, uint64(len(e.Value)))
		dst = append(dst, e.Value...)
		next = uint64(e.Rank) + 1
	}
	return dst, nil
}

// AppendKVs appends the encoding of kvs, which must be in strictly
// increasing key order, to dst.
func AppendKVs(dst []byte, kvs []KV) ([]byte, error) {
	dst = append(dst, tagKVs, version)
	dst = binary.AppendUvarint(dst, uint64(len(kvs)))
	for i, kv := range kvs {
		if i > 0 && bytes.Compare(kvs[i-1].Key, kv.Key) >= 0 {
			return dst, fmt.Errorf("encode put %d (key %q): %w", i, kv.Key, ErrOrder)
		}
		dst = binary.AppendUvarint(dst, uint64(kv.Owner))
		dst = binary.AppendUvarint(dst, uint64(len(kv.Key)))
		dst = append(dst, kv.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(kv.Value)))
		dst = append(dst, kv.Value...)
	}
	return dst, nil
}

// reader walks an encoding; the first error sticks.
type reader struct {
	b   []byte
	i   int
	err error
}

func (r *reader) fail(err error, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: at byte %d: %s", err, r.i, fmt.Sprintf(format, args...))
	}
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.i:])
	if n <= 0 {
		r.fail(ErrMalformed, "bad varint")
		return 0
	}
	r.i += n
	return v
}

// bytes returns the next n bytes, aliasing the input; max bounds n.
func (r *reader) bytes(max int, what string) []byte {
	n := r.uvarint()
	switch {
	case r.err != nil:
		return nil
	case n > uint64(max):
		r.fail(ErrLimit, "%s of %d bytes, limit %d", what, n, max)
		return nil
	case n > uint64(len(r.b)-r.i):
		r.fail(ErrMalformed, "%s of %d bytes, %d left", what, n, len(r.b)-r.i)
		return nil
	}
	v := r.b[r.i : r.i+int(n) : r.i+int(n)]
	r.i += int(n)
	return v
}

// header checks tag, version, total size and reads the entry count, which
// must be at most maxCount and possible in the bytes left (each entry takes
// at least minSize bytes).
func (r *reader) header(tag byte, lim Limits, maxCount uint64, minSize int) int {
	if err := lim.validate(); err != nil {
		r.err = err
		return 0
	}
	if len(r.b) > lim.MaxTotal {
		r.fail(ErrLimit, "%d bytes, limit %d", len(r.b), lim.MaxTotal)
		return 0
	}
	if len(r.b) < 2 || r.b[0] != tag || r.b[1] != version {
		r.fail(ErrMalformed, "bad tag or version")
		return 0
	}
	r.i = 2
	n := r.uvarint()
	if r.err == nil && (n > maxCount || n > uint64(len(r.b)-r.i)/uint64(minSize)) {
		r.fail(ErrMalformed, "%d entries in %d bytes", n, len(r.b)-r.i)
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

func (r *reader) end() {
	if r.err == nil && r.i != len(r.b) {
		r.fail(ErrMalformed, "%d trailing bytes", len(r.b)-r.i)
	}
}

// AppendDecodedEntries decodes an entry set, validating it against lim,
// and appends its entries to dst in rank order. Values alias b. On error
// dst is returned unchanged.
func AppendDecodedEntries(dst []Entry, b []byte, lim Limits) ([]Entry, error) {
	r := reader{b: b}
	n := r.header(tagEntries, lim, uint64(lim.Ranks), 2)
	dst0 := len(dst)
	dst = slices.Grow(dst, n)
	next := uint64(0)
	for range n {
		gap := r.uvarint()
		if r.err == nil && (gap >= uint64(lim.Ranks) || next+gap >= uint64(lim.Ranks)) {
			r.fail(ErrLimit, "rank %d+%d, limit %d", next, gap, lim.Ranks)
		}
		rank := next + gap
		v := r.bytes(lim.MaxEntry, "value")
		if r.err != nil {
			break
		}
		dst = append(dst, Entry{Rank: uint32(rank), Value: v})
		next = rank + 1
	}
	r.end()
	if r.err != nil {
		return dst[:dst0], fmt.Errorf("decode entries: %w", r.err)
	}
	return dst, nil
}

// DecodeEntries decodes an entry set into a new slice; values alias b.
func DecodeEntries(b []byte, lim Limits) ([]Entry, error) { return AppendDecodedEntries(nil, b, lim) }

// AppendDecodedKVs decodes a KV set, validating it against lim (owner <
// Ranks, 1 <= key length <= MaxKey, keys strictly increasing), and appends
// its puts to dst in key order. Keys and values alias b.
func AppendDecodedKVs(dst []KV, b []byte, lim Limits) ([]KV, error) {
	r := reader{b: b}
	n := r.header(tagKVs, lim, uint64(len(b)), 4)
	dst0 := len(dst)
	dst = slices.Grow(dst, n)
	var prev []byte
	for i := range n {
		owner := r.uvarint()
		if r.err == nil && owner >= uint64(lim.Ranks) {
			r.fail(ErrLimit, "owner %d, limit %d", owner, lim.Ranks)
		}
		k := r.bytes(lim.MaxKey, "key")
		v := r.bytes(lim.MaxValue, "value")
		switch {
		case r.err != nil:
		case len(k) == 0:
			r.fail(ErrMalformed, "empty key")
		case i > 0 && bytes.Compare(prev, k) >= 0:
			r.fail(ErrMalformed, "key %q after %q: %v", k, prev, ErrOrder)
		}
		if r.err != nil {
			break
		}
		dst = append(dst, KV{Key: k, Value: v, Owner: uint32(owner)})
		prev = k
	}
	r.end()
	if r.err != nil {
		return dst[:dst0], fmt.Errorf("decode puts: %w", r.err)
	}
	return dst, nil
}

// DecodeKVs decodes a KV set into a new slice; keys and values alias b.
func DecodeKVs(b []byte, lim Limits) ([]KV, error) { return AppendDecodedKVs(nil, b, lim) }

// MergeEntries decodes every part (each a valid entry set under lim),
// merges them in rank order and appends the encoding to dst. A rank in two
// parts is ErrConflict; a result longer than lim.MaxTotal is ErrLimit.
func MergeEntries(dst []byte, parts [][]byte, lim Limits) ([]byte, error) {
	return merge(dst, parts, lim, DecodeEntries, AppendEntries,
		func(a, b Entry) int { return cmp.Compare(a.Rank, b.Rank) },
		func(i, j int, a, b Entry) (Entry, error) {
			return a, fmt.Errorf("merge parts %d and %d: %w: rank %d", i, j, ErrConflict, b.Rank)
		})
}

// MergeKVs is MergeEntries for KV sets. A key put by ranks of two parts
// (two nodes) keeps the higher rank's value, as a node keeps the later
// of its ranks' (every node then commits the same value); a key of one
// owner in two parts is ErrConflict.
func MergeKVs(dst []byte, parts [][]byte, lim Limits) ([]byte, error) {
	return merge(dst, parts, lim, DecodeKVs, AppendKVs,
		func(a, b KV) int { return bytes.Compare(a.Key, b.Key) },
		func(i, j int, a, b KV) (KV, error) {
			switch {
			case a.Owner < b.Owner:
				return b, nil
			case a.Owner > b.Owner:
				return a, nil
			}
			return a, fmt.Errorf("merge parts %d and %d: %w: key %q (rank %d)", i, j, ErrConflict, b.Key, b.Owner)
		})
}

// merge decodes parts, each sorted by order, merges them k-way (of an
// item in two parts, resolve(part of the first, part of the second,
// first, second) keeps one, or fails) and appends the encoding of the
// result to dst, at most lim.MaxTotal bytes.
func merge[T any](dst []byte, parts [][]byte, lim Limits,
	decode func([]byte, Limits) ([]T, error), appendAll func([]byte, []T) ([]byte, error),
	order func(a, b T) int, resolve func(i, j int, a, b T) (T, error)) ([]byte, error) {
	lists := make([][]T, len(parts))
	total := 0
	for i, p := range parts {
		l, err := decode(p, lim)
		if err != nil {
			return dst, fmt.Errorf("merge part %d: %w", i, err)
		}
		lists[i] = l
		total += len(l)
	}
	merged := make([]T, 0, total)
	for {
		best := -1
		for i, l := range lists {
			if len(l) == 0 {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			switch c := order(l[0], lists[best][0]); {
			case c == 0:
				keep, err := resolve(best, i, lists[best][0], l[0])
				if err != nil {
					return dst, err
				}
				lists[best][0] = keep
				lists[i] = l[1:]
			case c < 0:
				best = i
			}
		}
		if best < 0 {
			break
		}
		merged = append(merged, lists[best][0])
		lists[best] = lists[best][1:]
	}
	start := len(dst)
	dst, err := appendAll(dst, merged)
	if err == nil && len(dst)-start > lim.MaxTotal {
		err = fmt.Errorf("%w: merged %d bytes, limit %d", ErrLimit, len(dst)-start, lim.MaxTotal)
	}
	if err != nil {
		return dst[:start], fmt.Errorf("merge %d parts: %w", len(parts), err)
	}
	return dst, nil
}
