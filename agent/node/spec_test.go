package node

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestReadSpecRefusesUnknownField: a spec line from a pmirun of another
// fastpmi build, asking for something this build does not know, is
// refused with the field and the reason named, not run without it.
func TestReadSpecRefusesUnknownField(t *testing.T) {
	spec := &Spec{JobID: "j", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Apps: []App{{Prog: "true", Size: 1}},
		KillGrace: time.Second, DisconnectGrace: time.Second}
	line := spec.Encode()
	if _, err := ReadSpec(bufio.NewReader(bytes.NewReader(line))); err != nil {
		t.Fatalf("this build's own spec: %v", err)
	}
	future := append([]byte(`{"ranks_nice":5,`), line[1:]...)
	_, err := ReadSpec(bufio.NewReader(bytes.NewReader(future)))
	if err == nil {
		t.Fatal("a spec with a field this build does not know was taken")
	}
	for _, want := range []string{`unknown field "ranks_nice"`, "another fastpmi build", "pmid fastpmi"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
