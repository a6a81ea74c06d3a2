package launch

import (
	"slices"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
)

// Nodes are named by their agents' host names; names that several nodes
// share, or that the node map cannot hold, get the node's index (a
// daemon's port), and never the name of another node.
func TestNodeNames(t *testing.T) {
	hellos := func(hosts ...string) []node.Hello {
		h := make([]node.Hello, len(hosts))
		for i, s := range hosts {
			h[i].Host = s
		}
		return h
	}
	for _, c := range []struct {
		hosts, want []string
		at          []string
	}{
		{[]string{"n1", "n2", "n3"}, []string{"n1", "n2", "n3"}, []string{"a:1", "b:2", "c:3"}},
		{[]string{"vm", "vm"}, []string{"vm-0", "vm-1"}, []string{"127.0.0.1", "127.0.0.1"}},
		{[]string{"n1", "vm", "vm"}, []string{"n1", "vm-1", "vm-2"}, nil},
		{[]string{"vm", "vm", "vm-1"}, []string{"vm-0", "vm-1.1", "vm-1"}, nil},
		{[]string{"", "a,b", "x y"}, []string{"node-0", "node-1", "node-2"}, nil},
		{[]string{"solo"}, []string{"solo"}, nil},
		{[]string{"vm", "vm", "vm"}, []string{"vm-7070", "vm-7071", "vm-2"}, []string{"127.0.0.1:7070", "127.0.0.1:7071", "127.0.0.1"}},
	} {
		got := nodeNames(hellos(c.hosts...), c.at)
		if !slices.Equal(got, c.want) {
			t.Errorf("hosts %q: names %q, want %q", c.hosts, got, c.want)
		}
		seen := map[string]bool{}
		for _, n := range got {
			if seen[n] || !agent.HostOK(n) {
				t.Errorf("hosts %q: names %q repeat or do not fit the node map", c.hosts, got)
			}
			seen[n] = true
		}
	}
}
