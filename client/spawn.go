package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// SpawnCmd is one command of a spawn: Procs processes run Prog with Args.
type SpawnCmd struct {
	Prog  string
	Args  []string
	Procs int
	// Info are hints for the launcher. pmirun honours "wdir" (the
	// children's working directory), "path" (where a bare Prog is
	// looked up), "host", "hosts" (comma-separated) and "hostfile" (the
	// nodes the children may run on); other keys are ignored, as Hydra
	// and Slurm do.
	Info map[string]string
}

// Spawn starts a new job of cmd.Procs processes and returns its job id
// once every child has started. The children are ranks 0..Procs-1 of
// their own job (Info().Spawned is true there, Appnum 0), with their own
// KVS, in which the keys of preput are readable from the start, before
// any fence: the way a parent hands its children where to find it. Names
// published by either job are found by the other.
func (c *Client) Spawn(ctx context.Context, cmd SpawnCmd, preput map[string]string) (string, error) {
	return c.SpawnMultiple(ctx, []SpawnCmd{cmd}, preput)
}

// SpawnMultiple starts one job running several commands, ranked in the
// order given (command i's processes have Appnum i), and returns its job
// id. A spawn that cannot be started — a program that is not found, a
// host that is not one of the run's nodes, no room left in the universe
// (universeSize) — starts no process and returns the launcher's reason,
// which names the command at fault.
func (c *Client) SpawnMultiple(ctx context.Context, cmds []SpawnCmd, preput map[string]string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("spawn"); err != nil {
		return "", err
	}
	req, err := spawnRequest(cmds, preput)
	if err != nil {
		return "", c.fail("spawn", err)
	}
	id, err := c.t.spawn(ctx, req)
	return id, c.fail("spawn", err)
}

// spawnRequest checks cmds and builds the wire request; map-valued
// fields go in key order, so the same call always sends the same bytes.
// No field may hold a NUL byte: PMI carries none, and no program can be
// started with one in its path or arguments.
func spawnRequest(cmds []SpawnCmd, preput map[string]string) (*pmiwire.Spawn, error) {
	if len(cmds) == 0 {
		return nil, errors.New("no command")
	}
	req := &pmiwire.Spawn{Preput: sortedPairs(preput)}
	if err := noNUL("preput", req.Preput); err != nil {
		return nil, err
	}
	for i, c := range cmds {
		if c.Prog == "" || c.Procs < 1 {
			return nil, fmt.Errorf("command %d: program %q with %d processes: want a program and at least 1 process", i, c.Prog, c.Procs)
		}
		cmd := pmiwire.SpawnCmd{Exe: c.Prog, MaxProcs: c.Procs, Args: c.Args, Info: sortedPairs(c.Info)}
		if strings.IndexByte(c.Prog, 0) >= 0 {
			return nil, fmt.Errorf("command %d: a NUL byte in program %q", i, c.Prog)
		}
		for j, a := range c.Args {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, fmt.Errorf("command %d: a NUL byte in argument %d %q", i, j, a)
			}
		}
		if err := noNUL(fmt.Sprintf("command %d: info", i), cmd.Info); err != nil {
			return nil, err
		}
		req.Cmds = append(req.Cmds, cmd)
	}
	return req, nil
}

// noNUL refuses pairs with a NUL byte in a key or value.
func noNUL(what string, ps []pmiwire.Pair) error {
	for _, p := range ps {
		if strings.IndexByte(p.Key, 0) >= 0 || strings.IndexByte(p.Val, 0) >= 0 {
			return fmt.Errorf("%s: a NUL byte in %q=%q", what, p.Key, p.Val)
		}
	}
	return nil
}

func sortedPairs(m map[string]string) []pmiwire.Pair {
	var ps []pmiwire.Pair
	for _, k := range slices.Sorted(maps.Keys(m)) {
		ps = append(ps, pmiwire.Pair{Key: k, Val: m[k]})
	}
	return ps
}
