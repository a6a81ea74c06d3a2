// Package netnstest holds the policy fastpmi's tests follow for test hosts
// (package netns): when a test needing them runs as root on a machine
// that cannot make them, it fails with the reason; run by an ordinary
// user it skips, saying why. Set FASTPMI_NETNS=require to fail in every
// case.
//
// New makes a cluster whose prefix is unique to the process and the call,
// and closes it when the test ends, failing the test if Close finds
// leftovers. The first New of a process removes namespaces left by test
// binaries that died (netns.CleanupStale with base Base).
package netnstest

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/netns"
)

// Base starts the prefix of every cluster made by New.
const Base = "fpmit"

// setupTimeout bounds the making of one cluster.
const setupTimeout = 30 * time.Second

var (
	seq       atomic.Int64
	staleOnce sync.Once
)

// Require fails tb with the reason if test hosts cannot be made here and
// the test runs as root (or FASTPMI_NETNS=require); otherwise it skips tb
// with the reason.
func Require(tb testing.TB) {
	tb.Helper()
	err := netns.Available()
	if err == nil {
		return
	}
	if os.Geteuid() == 0 || os.Getenv("FASTPMI_NETNS") == "require" {
		tb.Fatalf("multi-host test cannot run: %v", err)
	}
	tb.Skipf("multi-host test skipped: %v", err)
}

// Prefix returns a fresh cluster prefix, unique to this process and call.
func Prefix() string {
	return netns.PrefixFor(Base, strconv.FormatInt(seq.Add(1), 10))
}

// New calls Require, then makes a cluster of hosts test hosts with a fresh
// prefix and the default subnet, and closes it when tb ends.
func New(tb testing.TB, hosts int) *netns.Cluster {
	tb.Helper()
	Require(tb)
	staleOnce.Do(func() {
		if err := netns.CleanupStale(Base); err != nil {
			tb.Logf("clean up stale test hosts: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := netns.New(ctx, netns.Config{Hosts: hosts, Prefix: Prefix()})
	if err != nil {
		tb.Fatalf("make test hosts: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("close test hosts: %v", err)
		}
	})
	return c
}
