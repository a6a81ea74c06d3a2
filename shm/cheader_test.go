package shm

import (
	"bytes"
	"os"
	"testing"
)

// The C header libfastpmi compiles against is what CHeader renders now:
// a change of the layout without go generate fails here.
func TestCHeaderCommitted(t *testing.T) {
	got, err := os.ReadFile("../clib/fastpmi_layout.h")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, CHeader()) {
		t.Fatalf("clib/fastpmi_layout.h differs from the layout in package shm: run go generate ./shm")
	}
}
