package netns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
)

// probeBase starts the name of the throw-away namespace Available makes.
const probeBase = "fpmiprobe"

// Available reports whether test hosts can be made on this machine. If
// not, the error wraps ErrUnavailable and says why: not Linux, not root,
// no `ip` program, or the kernel refusing to make a network namespace, a
// bridge or a veth pair (tried in a throw-away namespace). The probe runs
// once per process; the answer is cached.
func Available() error { return available() }

var available = sync.OnceValue(probe)

func probe() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: network namespaces need Linux, this is %s", ErrUnavailable, runtime.GOOS)
	}
	if euid := os.Geteuid(); euid != 0 {
		return fmt.Errorf("%w: not running as root (euid %d); making network namespaces needs root", ErrUnavailable, euid)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: find the ip program of iproute2 (install package iproute2): %w", ErrUnavailable, err)
	}
	_ = CleanupStale(probeBase) // a failure shows again below
	name := PrefixFor(probeBase, "p")
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	if _, err := runIP(ctx, "netns", "add", name); err != nil {
		return fmt.Errorf("%w: make a network namespace: %w", ErrUnavailable, err)
	}
	defer removeNamespaces(ctx, []string{name})
	steps := [][]string{
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "link", "add", "br0", "type", "bridge"},
		{"-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		{"-n", name, "link", "set", "v1", "master", "br0"},
	}
	if err := runSteps(ctx, "make a bridge and a veth pair in a namespace", steps); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}
