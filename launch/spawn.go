package launch

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/ring"
)

// Spawn. A rank's spawn request reaches the root through its agent's
// Upstream (the fork bootstrap: in this process; other bootstraps: a Name
// frame with Op "spawn"). The root makes the request a new job of the
// run — its own job id, KVS, world and Spec.Jobno, the spawner's pre-put
// keys in its KVS, PMI_SPAWNED — places its ranks on the run's nodes and
// starts it there: in pmirun for the fork bootstrap, else by submitting
// its nodes to the agents already on them, the daemons (--daemons) or
// the first job's agents, which host the run's jobs (multiRun.hostd).
// The spawner is answered with the new job's id once
// every child has started, or with the reason none did (printed on
// stderr too: MPI libraries show their users only a return code). A
// failed spawn does not end the spawning job. Every job of the run then
// shares the root's name service and fate: the run ends when every job
// has ended, and the first failure of any job ends them all.

// The info keys a spawn honours (Hydra's and Slurm's); any other is
// ignored, as both do.
const (
	infoWdir     = "wdir"     // the children's working directory
	infoPath     = "path"     // where a bare program name is looked up
	infoHost     = "host"     // the node every child of the command runs on
	infoHosts    = "hosts"    // comma-separated nodes the children are spread over
	infoHostfile = "hostfile" // a file naming those nodes, one per line
	// infoNodes is fastpmi's own: with the value "node", every child of
	// the command runs on the node of the spawning job, which must run
	// on one node (host, hosts or hostfile must include it).
	infoNodes = "fastpmi_nodes"
)

// spawnReq is a spawn request as the root places it.
type spawnReq struct {
	req   *pmiwire.Spawn
	size  int
	hosts [][]int // per command: the nodes it may use (nil = any)
	apps  []node.App
}

// newSpawnReq checks req against the run: hostNames are the run's nodes
// (for the fork bootstrap, this machine's names for node 0), parent the
// run's nodes that the spawning job uses.
func newSpawnReq(req *pmiwire.Spawn, hostNames func(name string) []int, parent []int, wdir string) (*spawnReq, error) {
	if req == nil || len(req.Cmds) == 0 {
		return nil, fmt.Errorf("spawn request with no command")
	}
	s := &spawnReq{req: req, hosts: make([][]int, len(req.Cmds))}
	for i, c := range req.Cmds {
		if c.MaxProcs < 1 {
			return nil, fmt.Errorf("command %d (%s): %d processes, want at least 1", i, c.Exe, c.MaxProcs)
		}
		if s.size += c.MaxProcs; s.size > node.MaxRanks {
			return nil, fmt.Errorf("spawn of more than %d processes", node.MaxRanks)
		}
		app := node.App{Prog: c.Exe, Args: c.Args, Size: c.MaxProcs, Env: c.Env}
		var names []string
		withParent := false
		for _, p := range c.Info {
			switch p.Key {
			case infoNodes:
				if p.Val != "node" {
					return nil, fmt.Errorf("command %d (%s): info %s=%q: want \"node\"", i, c.Exe, infoNodes, p.Val)
				}
				if len(parent) != 1 {
					return nil, fmt.Errorf("command %d (%s): info %s=node asks for the spawning job's node, and it runs on %d",
						i, c.Exe, infoNodes, len(parent))
				}
				withParent = true
			case infoWdir:
				app.Wdir = p.Val
			case infoPath:
				app.Path = p.Val
			case infoHost:
				names = append(names, strings.TrimSpace(p.Val))
			case infoHosts:
				for _, h := range strings.Split(p.Val, ",") {
					if h = strings.TrimSpace(h); h != "" {
						names = append(names, h)
					}
				}
			case infoHostfile:
				hs, err := readHostfile(p.Val, wdir)
				if err != nil {
					return nil, fmt.Errorf("command %d (%s): info hostfile: %w", i, c.Exe, err)
				}
				names = append(names, hs...)
			}
		}
		for _, h := range names {
			ns := hostNames(h)
			if len(ns) == 0 {
				return nil, fmt.Errorf("command %d (%s): host %q is not a node of this job", i, c.Exe, h)
			}
			for _, n := range ns {
				if !slices.Contains(s.hosts[i], n) {
					s.hosts[i] = append(s.hosts[i], n)
				}
			}
		}
		if withParent {
			if s.hosts[i] == nil {
				s.hosts[i] = slices.Clone(parent)
			} else {
				s.hosts[i] = slices.DeleteFunc(s.hosts[i], func(n int) bool { return !slices.Contains(parent, n) })
				if len(s.hosts[i]) == 0 {
					return nil, fmt.Errorf("command %d (%s): none of its hosts is the spawning job's node (info %s=node)", i, c.Exe, infoNodes)
				}
			}
		}
		s.apps = append(s.apps, app)
	}
	return s, nil
}

// fits refuses the request when the universe size u (-1: unlimited)
// leaves no room for it beside the live processes of the run's jobs.
func (s *spawnReq) fits(u, live int) error {
	if u > 0 && live+s.size > u {
		return fmt.Errorf("%d more processes do not fit the universe size %d (%d running)", s.size, u, live)
	}
	return nil
}

// spawnFailed says on stderr why a spawn started nothing: MPI libraries
// show their users only a return code.
func spawnFailed(stderr io.Writer, parent int, err error) {
	fmt.Fprintf(stderr, "pmirun: spawn requested by job %d failed: %v\n", parent, err)
}

// readHostfile reads a spawn's hostfile info key (ReadHostfile's format)
// relative to wdir, and returns its host names without their slots.
func readHostfile(path, wdir string) ([]string, error) {
	if !filepath.IsAbs(path) && wdir != "" {
		path = filepath.Join(wdir, path)
	}
	hosts, err := ReadHostfile(path)
	for i, h := range hosts {
		hosts[i] = hostOf(h)
	}
	return hosts, err
}

// hostOf is the host of a hostfile's HOST:SLOTS: HOST, an IPv6 address
// in brackets ([fd00::2]:4) or alone (fd00::2, whose last group is the
// address's, not slots).
func hostOf(h string) string {
	if addr, ok := strings.CutPrefix(h, "["); ok {
		addr, _, _ = strings.Cut(addr, "]")
		return addr
	}
	if strings.Count(h, ":") > 1 {
		return h
	}
	host, _, _ := strings.Cut(h, ":")
	return host
}

// place assigns the request's ranks to the run's k nodes: each command's
// ranks round robin over the nodes it may use, starting where the
// previous command stopped; load, when set, orders the nodes by the
// processes they run (least loaded first) instead. It returns every
// node's ranks (empty for a node without children).
func (s *spawnReq) place(k int, load []int) [][]int {
	nodes := make([][]int, k)
	next, r := 0, 0
	for i, c := range s.req.Cmds {
		use := s.hosts[i]
		if use == nil {
			use = make([]int, k)
			for n := range use {
				use[n] = n
			}
		}
		if load != nil {
			use = slices.Clone(use)
			slices.SortStableFunc(use, func(a, b int) int { return load[a] - load[b] })
			next = 0
		}
		for j := 0; j < c.MaxProcs; j++ {
			n := use[(next+j)%len(use)]
			nodes[n] = append(nodes[n], r)
			r++
		}
		next = (next + c.MaxProcs) % len(use)
	}
	return nodes
}

// childSpec is the spec of spawned job number jobno of the run whose
// command-line job is root, spawned by rank parentRank of job parentID,
// with its ranks on nodes (global node index → ranks; nodes without
// children are dropped: the child job's node list is its own). It also
// returns, for each of the child's nodes, the run's node index.
func (s *spawnReq) childSpec(root *node.Spec, parentID string, parentRank, jobno int, nodes [][]int) (*node.Spec, []int) {
	child := *root
	child.JobID = root.JobID + "-" + strconv.Itoa(jobno)
	child.Jobno = jobno
	child.Size = s.size
	child.Apps = s.apps
	child.SpawnerJobID, child.SpawnerRank = parentID, parentRank
	child.Preput = s.req.Preput
	child.Virtual, child.VirtualRounds, child.VirtualLate, child.VirtualWork = "", 0, 0, 0
	// pmirun's input is the command line's job's: a spawned job reads
	// none (no reader of it per spawn, none left blocked on it after).
	child.StdinRank = -1
	// Its ranks' output files are its own: %r reads "jobno,rank" (as in
	// its output prefixes, node.New).
	jr := strconv.Itoa(jobno) + ",%r"
	child.OutPattern = strings.ReplaceAll(root.OutPattern, "%r", jr)
	child.ErrPattern = strings.ReplaceAll(root.ErrPattern, "%r", jr)
	child.Nodes = nil
	var at []int
	for n, rs := range nodes {
		if len(rs) > 0 {
			child.Nodes = append(child.Nodes, rs)
			at = append(at, n)
		}
	}
	// Its own placement, in the vector form of the command line's job's
	// (round robin placements included: MPICH reads any vector).
	child.Mapping = ""
	if m, err := ring.FromNodes(child.Nodes); err == nil {
		child.Mapping = m.ProcessMapping()
	}
	return &child, at
}
