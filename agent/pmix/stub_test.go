//go:build !pmix

package pmix

import (
	"errors"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
)

// A build without the pmix tag refuses PMIx jobs with ErrNotSupported,
// whose message says how to get PMIx support.
func TestStubNotSupported(t *testing.T) {
	a, err := agent.New(agent.Config{Size: 1, Local: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = NewJob(Config{Agent: a, Nspace: "ns", Size: 1, Nodes: [][]int{{0}}})
	if !errors.Is(err, ErrNotSupported) || Supported {
		t.Fatalf("NewJob: %v (Supported %v), want ErrNotSupported", err, Supported)
	}
}
