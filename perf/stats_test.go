package perf

import (
	"slices"
	"testing"
	"time"
)

func TestMedianPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	odd := ms(9, 1, 5, 3, 7)
	even := ms(4, 1, 3, 2)
	orig := slices.Clone(odd)
	for _, c := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"median odd", Median(odd), 5 * time.Millisecond},
		{"median even", Median(even), 2500 * time.Microsecond},
		{"median one", Median(ms(7)), 7 * time.Millisecond},
		{"median none", Median(nil), 0},
		{"p0", Percentile(odd, 0), 1 * time.Millisecond},
		{"p100", Percentile(odd, 100), 9 * time.Millisecond},
		{"p25", Percentile(odd, 25), 3 * time.Millisecond},
		{"p90 interpolated", Percentile(odd, 90), 8200 * time.Microsecond},
		{"clamped high", Percentile(odd, 250), 9 * time.Millisecond},
		{"clamped low", Percentile(odd, -1), 1 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if !slices.Equal(odd, orig) {
		t.Errorf("Median/Percentile modified their input: %v", odd)
	}
}

func TestDescribe(t *testing.T) {
	s := Describe([]time.Duration{30, 10, 20, 40})
	want := Stats{N: 4, Min: 10, Median: 25, P90: 37, Max: 40, Mean: 25}
	if s != want {
		t.Errorf("Describe = %+v, want %+v", s, want)
	}
	if s := Describe(nil); s != (Stats{}) {
		t.Errorf("Describe(nil) = %+v", s)
	}
}

func TestMarkdownTable(t *testing.T) {
	header := []string{"N", "workload", "pmirun", "ratio"}
	got := MarkdownTable(header, [][]string{
		{"1", "pmi2", "3.1ms", "0.42x"},
		{"128", "a|b", "-"}, // short row, pipe to escape
	})
	want := "" +
		"|   N | workload | pmirun | ratio |\n" +
		"| --: | -------- | -----: | ----: |\n" +
		"|   1 | pmi2     |  3.1ms | 0.42x |\n" +
		"| 128 | a\\|b     |      - |       |\n"
	if got != want {
		t.Errorf("MarkdownTable =\n%s\nwant\n%s", got, want)
	}
	if header[1] != "workload" {
		t.Error("MarkdownTable modified its header")
	}
	if got := MarkdownTable(nil, nil); got != "" {
		t.Errorf("empty table = %q", got)
	}
}
