package node

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Prefix is the pattern put before every output line of a rank: %r is
// the rank, %h the node's name, %t the time the line was read (UTC,
// microseconds), %% a percent sign. The zero Prefix puts nothing.
type Prefix struct {
	pattern string
	host    string
}

// NewPrefix returns the prefix for pattern on the node named host (%h);
// the pattern was checked (CheckPattern).
func NewPrefix(pattern, host string) Prefix {
	return Prefix{pattern: pattern, host: host}
}

// CheckPattern checks that pattern uses only %% and the letters in
// verbs after a percent sign.
func CheckPattern(pattern, verbs string) error {
	for i := 0; i < len(pattern); i++ {
		if pattern[i] != '%' {
			continue
		}
		if i+1 == len(pattern) {
			return fmt.Errorf("%q ends with a lone %%", pattern)
		}
		i++
		if c := pattern[i]; c != '%' && !strings.ContainsRune(verbs, rune(c)) {
			return fmt.Errorf("%q: unknown %%%c (want %s)", pattern, c, verbsList(verbs))
		}
	}
	return nil
}

func verbsList(verbs string) string {
	var s []string
	for _, c := range verbs {
		s = append(s, "%"+string(c))
	}
	return strings.Join(append(s, "%%"), ", ")
}

// Expand fills pattern's %r and %h (and %t with now) for rank r on host.
func Expand(pattern string, r int, host string, now time.Time) string {
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if c != '%' || i+1 == len(pattern) {
			b.WriteByte(c)
			continue
		}
		i++
		switch pattern[i] {
		case 'r':
			b.WriteString(strconv.Itoa(r))
		case 'h':
			b.WriteString(host)
		case 't':
			b.WriteString(now.UTC().Format("2006-01-02T15:04:05.000000"))
		default:
			b.WriteByte(pattern[i])
		}
	}
	return b.String()
}

// rankPrefix is one rank's prefix: fixed bytes, or a pattern expanded
// per line when it holds %t.
type rankPrefix struct {
	fixed   []byte
	pattern string // non-empty: expand per line
	rank    int
	host    string
}

func (p Prefix) forRank(r int) rankPrefix {
	if p.pattern == "" {
		return rankPrefix{}
	}
	if strings.Contains(strings.ReplaceAll(p.pattern, "%%", ""), "%t") {
		return rankPrefix{pattern: p.pattern, rank: r, host: p.host}
	}
	return rankPrefix{fixed: []byte(Expand(p.pattern, r, p.host, time.Time{}))}
}

// line appends the prefix of a line read now to dst.
func (rp rankPrefix) line(dst []byte) []byte {
	if rp.pattern == "" {
		return append(dst, rp.fixed...)
	}
	return append(dst, Expand(rp.pattern, rp.rank, rp.host, time.Now())...)
}
