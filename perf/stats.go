package perf

import (
	"math"
	"slices"
	"strings"
	"time"
)

// Median returns the median of ds (the mean of the two middle values for an
// even count), or 0 for no samples. ds is not modified.
func Median(ds []time.Duration) time.Duration { return Percentile(ds, 50) }

// Percentile returns the p-th percentile (0 <= p <= 100, clamped) of ds,
// interpolating linearly between the closest ranks, or 0 for no samples.
// ds is not modified.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	if math.IsNaN(p) {
		p = 50
	}
	p = min(max(p, 0), 100)
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	frac := pos - float64(lo)
	return s[lo] + time.Duration(math.Round(frac*float64(s[hi]-s[lo])))
}

// Stats describes a set of duration samples.
type Stats struct {
	N      int
	Min    time.Duration
	Median time.Duration
	P90    time.Duration
	Max    time.Duration
	Mean   time.Duration
}

// Describe returns the Stats of ds; all zero for no samples. ds is not
// modified.
func Describe(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum float64
	for _, d := range s {
		sum += float64(d)
	}
	return Stats{
		N:      len(s),
		Min:    s[0],
		Median: percentileSorted(s, 50),
		P90:    percentileSorted(s, 90),
		Max:    s[len(s)-1],
		Mean:   time.Duration(math.Round(sum / float64(len(s)))),
	}
}

// MarkdownTable formats header and rows as a GitHub-flavoured markdown
// table with padded columns. Rows shorter than header are padded with empty
// cells, longer ones are cut. Cells that look numeric ("3.1ms", "1.25x",
// "-") are right-aligned by the column's alignment row when the whole
// column is numeric. A "|" in a cell is escaped.
func MarkdownTable(header []string, rows [][]string) string {
	n := len(header)
	if n == 0 {
		return ""
	}
	cells := make([][]string, 0, len(rows)+1)
	cells = append(cells, slices.Clone(header))
	for _, row := range rows {
		c := make([]string, n)
		copy(c, row)
		cells = append(cells, c)
	}
	width := make([]int, n)
	numeric := make([]bool, n)
	for j := range numeric {
		numeric[j] = len(rows) > 0
	}
	for i, row := range cells {
		for j := range row {
			row[j] = strings.ReplaceAll(row[j], "|", `\|`)
			width[j] = max(width[j], len([]rune(row[j])), 3)
			if i > 0 && !looksNumeric(row[j]) {
				numeric[j] = false
			}
		}
	}
	var b strings.Builder
	line := func(row []string) {
		b.WriteByte('|')
		for j, c := range row {
			pad := strings.Repeat(" ", width[j]-len([]rune(c)))
			b.WriteByte(' ')
			if numeric[j] {
				b.WriteString(pad + c)
			} else {
				b.WriteString(c + pad)
			}
			b.WriteString(" |")
		}
		b.WriteByte('\n')
	}
	line(cells[0])
	b.WriteByte('|')
	for j := range n {
		if numeric[j] {
			b.WriteString(" " + strings.Repeat("-", width[j]-1) + ": |")
		} else {
			b.WriteString(" " + strings.Repeat("-", width[j]) + " |")
		}
	}
	b.WriteByte('\n')
	for _, row := range cells[1:] {
		line(row)
	}
	return b.String()
}

// looksNumeric reports whether s starts like a number ("12", "3.1ms",
// "-0.5", "1.25x") or is a lone "-" (a missing value).
func looksNumeric(s string) bool {
	s = strings.TrimSpace(s)
	if s == "-" || s == "" {
		return true
	}
	s = strings.TrimPrefix(s, "-")
	return s != "" && s[0] >= '0' && s[0] <= '9'
}
