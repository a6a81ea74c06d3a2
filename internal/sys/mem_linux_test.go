package sys

import "testing"

// The peak RSS of a running test is some MiB; a memfd holds the pages
// written to it and no more.
func TestMemoryFigures(t *testing.T) {
	rss, err := PeakRSS()
	if err != nil || rss < 1<<20 {
		t.Fatalf("PeakRSS = %d, %v; want at least 1 MiB", rss, err)
	}
	f, err := MemfdCreate("mem-test")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if b, err := FileMemory(f); err != nil || b != 0 {
		t.Fatalf("untouched memfd holds %d bytes (%v), want 0", b, err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 8<<20); err != nil {
		t.Fatal(err)
	}
	b, err := FileMemory(f)
	if err != nil || b < 1<<20 || b > 2<<20 {
		t.Fatalf("memfd with 1 MiB written holds %d bytes (%v), want 1-2 MiB", b, err)
	}
}
