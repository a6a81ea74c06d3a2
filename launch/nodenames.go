package launch

import (
	"fmt"
	"strconv"

	"github.com/fastpmi/fastpmi/agent/node"
)

// nodeNames names the run's nodes for the ranks (node.Table.Hosts:
// PMIx's node map and every rank's PMIX_HOSTNAME) from the hellos of the
// first job's agents, one a node of the run: each agent's host name, as
// Slurm and PRRTE name nodes. A name that several nodes share (agents of
// one machine: the loopback bootstrap, test hosts, daemons of one host),
// or none, becomes the host name and the node's index: the node map tells
// nodes apart by name. Every job of the run names a node alike.
func nodeNames(hellos []node.Hello) []string {
	count := make(map[string]int, len(hellos))
	for _, h := range hellos {
		count[h.Host]++
	}
	names := make([]string, len(hellos))
	taken := make(map[string]bool, len(hellos))
	for i, h := range hellos {
		if h.Host != "" && count[h.Host] == 1 && validNodeName(h.Host) {
			names[i] = h.Host
			taken[h.Host] = true
		}
	}
	for i, h := range hellos {
		if names[i] != "" {
			continue
		}
		base := h.Host
		if base == "" || !validNodeName(base) {
			base = "node"
		}
		names[i] = base + "-" + strconv.Itoa(i)
		for n := 1; taken[names[i]]; n++ { // a host already called that
			names[i] = fmt.Sprintf("%s-%d.%d", base, i, n)
		}
		taken[names[i]] = true
	}
	return names
}

// validNodeName reports whether a host name can stand in PMIx's node map,
// a comma-separated list.
func validNodeName(h string) bool {
	for _, c := range h {
		if c == ',' || c == ';' || c <= ' ' {
			return false
		}
	}
	return true
}
