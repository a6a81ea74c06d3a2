package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Cleanup removes every namespace whose name starts with prefix: it kills
// the processes inside them and deletes them. It is for leftovers of a run
// that crashed before Close; it must not be given the prefix of a cluster
// still in use. An empty or malformed prefix is refused.
func Cleanup(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return fmt.Errorf("clean up namespaces: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	names, err := listNamespaces(ctx, prefix)
	if err != nil {
		return fmt.Errorf("clean up namespaces %s*: %w", prefix, err)
	}
	if err := removeNamespaces(ctx, names); err != nil {
		return fmt.Errorf("clean up namespaces %s*: %w", prefix, err)
	}
	return nil
}

// CleanupStale removes the namespaces of dead runs among those named
// base+PID+"-"...: those whose PID is no longer a running process. It
// leaves alone the namespaces of live processes (other test binaries
// running at the same time) and names of any other form, so it is safe to
// call at the start of every run. Prefixes made by PrefixFor have this
// form.
func CleanupStale(base string) error {
	if err := checkPrefix(base); err != nil {
		return fmt.Errorf("clean up stale namespaces: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	names, err := listNamespaces(ctx, base)
	if err != nil {
		return fmt.Errorf("clean up stale namespaces %s*: %w", base, err)
	}
	var stale []string
	for _, name := range names {
		digits, _, ok := strings.Cut(strings.TrimPrefix(name, base), "-")
		pid, err := strconv.Atoi(digits)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if pid != os.Getpid() && !processExists(pid) {
			stale = append(stale, name)
		}
	}
	var errs []error
	if err := removeNamespaces(ctx, stale); err != nil {
		errs = append(errs, fmt.Errorf("clean up stale namespaces %s*: %w", base, err))
	}
	return errors.Join(errs...)
}

// PrefixFor returns base+PID+"-"+tag+"-", a prefix unique to this process
// and tag that CleanupStale(base) recognises; tag tells apart the clusters
// of one process.
func PrefixFor(base, tag string) string {
	return base + strconv.Itoa(os.Getpid()) + "-" + tag + "-"
}

// processExists reports whether pid names a live (not zombie) process.
func processExists(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}
