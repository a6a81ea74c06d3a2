package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ipTimeout bounds each `ip` invocation, whatever the caller's context.
const ipTimeout = 10 * time.Second

// runIP runs `ip args...` and returns its standard output. The error names
// the command and carries what ip printed.
func runIP(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, ipTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return nil, fmt.Errorf("run ip %s: %w", strings.Join(args, " "), err)
		}
		return nil, fmt.Errorf("run ip %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// listNamespaces returns the names of the named network namespaces that
// start with prefix.
func listNamespaces(ctx context.Context, prefix string) ([]string, error) {
	out, err := runIP(ctx, "netns", "list")
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		// Lines read "NAME" or "NAME (id: N)".
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// rootLinks returns the names of the links in the caller's namespace that
// start with prefix. The package never makes any; this is a check.
func rootLinks(ctx context.Context, prefix string) ([]string, error) {
	out, err := runIP(ctx, "-o", "link", "show")
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		// Lines read "N: NAME[@PEER]: <FLAGS> ...".
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	return names, nil
}

// namespacePids returns the pids of the processes inside namespace name.
func namespacePids(ctx context.Context, name string) ([]int, error) {
	out, err := runIP(ctx, "netns", "pids", name)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", name, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse pid %q of %s: %w", f, name, err)
		}
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killNamespaces sends SIGKILL to every process inside the named namespaces
// and repeats until none is left (a process may fork while it is being
// killed) or ctx ends. Killed children of the caller become zombies until
// the caller waits for them; zombies have left their namespace and are not
// listed.
func killNamespaces(ctx context.Context, names []string) error {
	for {
		var left []int
		for _, name := range names {
			pids, err := namespacePids(ctx, name)
			if err != nil {
				return err
			}
			for _, pid := range pids {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill() // it may have exited already
					_ = p.Release()
				}
			}
			left = append(left, pids...)
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill processes %v in namespaces: %w", left, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// removeNamespaces kills the processes inside the named namespaces and
// deletes the namespaces, which deletes their links. It goes on after an
// error and returns all of them.
func removeNamespaces(ctx context.Context, names []string) error {
	var errs []error
	if err := killNamespaces(ctx, names); err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if _, err := runIP(ctx, "netns", "delete", name); err != nil {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
