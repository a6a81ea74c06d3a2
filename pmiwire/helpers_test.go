package pmiwire

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// result is one outcome of Decoder.Next: a request or a *SyntaxError.
type result struct {
	Msg Msg
	Err error
}

func (r result) String() string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	return fmt.Sprintf("%+v", r.Msg)
}

// decodeStream feeds data to a new Decoder in chunks whose sizes cycle
// through sizes (none: all at once) and collects every result. It returns
// the sticky framing error, if one ended the stream. It also checks that
// each result consumed input, so that a caller looping on Next can never
// spin: an error is returned if a result left Buffered unchanged.
func decodeStream(data []byte, sizes ...int) ([]result, error) {
	return decodeChunks(data, func(d *Decoder, b []byte) error { d.Feed(b); return nil }, sizes...)
}

// fillStream is decodeStream with each chunk read by Fill from a reader
// of that chunk, as a connection would deliver it.
func fillStream(data []byte, sizes ...int) ([]result, error) {
	return decodeChunks(data, func(d *Decoder, b []byte) error {
		r := bytes.NewReader(b)
		for r.Len() > 0 {
			if _, err := d.Fill(r); err != nil {
				return err
			}
		}
		return nil
	}, sizes...)
}

func decodeChunks(data []byte, feed func(*Decoder, []byte) error, sizes ...int) ([]result, error) {
	var d Decoder
	var out []result
	if len(sizes) == 0 {
		sizes = []int{len(data) + 1}
	}
	for i, k := 0, 0; i < len(data); k++ {
		n := max(1, sizes[k%len(sizes)])
		n = min(n, len(data)-i)
		if err := feed(&d, data[i:i+n]); err != nil {
			return out, err
		}
		i += n
		for {
			before := d.Buffered()
			m, ok, err := d.Next()
			var se *SyntaxError
			switch {
			case err != nil && !errors.As(err, &se):
				return out, err
			case err != nil:
				out = append(out, result{Err: err})
			case ok:
				out = append(out, result{Msg: m})
			}
			if !ok && err == nil {
				break
			}
			if d.Buffered() >= before {
				return out, fmt.Errorf("decoder made no progress: Buffered %d -> %d after %v", before, d.Buffered(), out[len(out)-1])
			}
		}
	}
	return out, nil
}

// sameResults compares two result lists: messages deeply, syntax errors by
// framing, command and reason.
func sameResults(a, b []result) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d results vs %d:\n%v\n%v", len(a), len(b), a, b)
	}
	for i := range a {
		if err := sameResult(a[i], b[i]); err != nil {
			return fmt.Errorf("result %d: %w", i, err)
		}
	}
	return nil
}

func sameResult(a, b result) error {
	if (a.Err == nil) != (b.Err == nil) {
		return fmt.Errorf("%v vs %v", a, b)
	}
	if a.Err != nil {
		var sa, sb *SyntaxError
		if !errors.As(a.Err, &sa) || !errors.As(b.Err, &sb) || !reflect.DeepEqual(sa, sb) {
			return fmt.Errorf("%v vs %v", a.Err, b.Err)
		}
		return nil
	}
	if !reflect.DeepEqual(a.Msg, b.Msg) {
		return fmt.Errorf("%+v vs %+v", a.Msg, b.Msg)
	}
	return nil
}

// sameSticky reports whether two framing errors are of the same kind.
func sameSticky(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, ErrTooLong) == errors.Is(b, ErrTooLong) &&
		errors.Is(a, ErrBadHeader) == errors.Is(b, ErrBadHeader)
}

// frameV2 puts a body behind a right-aligned (MPICH) or left-aligned
// (Slurm) 6-byte header.
func frameV2(body string, left bool) string {
	if left {
		return fmt.Sprintf("%-6d%s", len(body), body)
	}
	return fmt.Sprintf("%6d%s", len(body), body)
}

// pairs builds a field list from "k=v" strings; a string without '=' is a
// key without value.
func pairs(kv ...string) []Pair {
	var out []Pair
	for _, s := range kv {
		k, v, ok := strings.Cut(s, "=")
		out = append(out, Pair{Key: k, Val: v, NoVal: !ok})
	}
	return out
}
