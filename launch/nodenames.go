package launch

import (
	"fmt"
	"net"
	"strconv"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
)

// nodeNames names the run's nodes for the ranks (node.Table.Hosts:
// PMIx's node map and every rank's PMIX_HOSTNAME) from the hellos of the
// first job's agents, one a node of the run at hosts (the bootstrap's
// names or addresses): each agent's host name, as Slurm and PRRTE name
// nodes. A name that several nodes share (agents of one machine: the
// loopback bootstrap, test hosts, daemons of one host), or none, becomes
// the host name and the node's index — the node map tells nodes apart by
// name — or, for a node at an address with a port (a daemon), that port,
// so that runs on the same daemons name them alike. Every job of the run
// names a node alike.
func nodeNames(hellos []node.Hello, hosts []string) []string {
	count := make(map[string]int, len(hellos))
	for _, h := range hellos {
		count[h.Host]++
	}
	names := make([]string, len(hellos))
	taken := make(map[string]bool, len(hellos))
	for i, h := range hellos {
		if count[h.Host] == 1 && agent.HostOK(h.Host) {
			names[i] = h.Host
			taken[h.Host] = true
		}
	}
	for i, h := range hellos {
		if names[i] != "" {
			continue
		}
		base := h.Host
		if !agent.HostOK(base) {
			base = "node"
		}
		suffix := strconv.Itoa(i)
		if i < len(hosts) {
			if _, port, err := net.SplitHostPort(hosts[i]); err == nil && port != "" {
				suffix = port
			}
		}
		names[i] = base + "-" + suffix
		for n := 1; taken[names[i]]; n++ { // a host already called that
			names[i] = fmt.Sprintf("%s-%s.%d", base, suffix, n)
		}
		taken[names[i]] = true
	}
	return names
}
