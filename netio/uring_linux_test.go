package netio

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"testing"
)

// Closing an io_uring transport unmaps its provided-buffer ring: giouring
// only unregisters it, and a daemon that made a transport per job kept a
// page mapped for every job it ever ran (12 MB after 3000 spawns).
func TestUringCloseUnmapsBufRing(t *testing.T) {
	if ok, why := probeUring(); !ok {
		t.Skip("io_uring unavailable: " + why)
	}
	tr := newTestTransport(t, BackendUring, nil)
	ring := reflect.ValueOf(tr.(*transport).be.(*uringBackend).br).Pointer()
	if !mapped(t, ring) {
		t.Fatalf("the buffer ring at %#x is not in /proc/self/maps", ring)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if mapped(t, ring) {
		t.Errorf("the buffer ring at %#x is still mapped after Close", ring)
	}
}

// mapped reports whether addr lies in one of the process's mappings.
func mapped(t *testing.T, addr uintptr) bool {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}
