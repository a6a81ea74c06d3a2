// Package netns builds fastpmi's test hosts: K network namespaces on one
// machine wired to one virtual switch, so that multi-node tests and the
// `netns` bootstrap exercise real cross-host TCP without a second machine.
//
// The model: New makes one "switch" namespace (name Prefix+"sw") holding a
// Linux bridge (br0), and K host namespaces (names Prefix+"h0" ...). Host i
// owns one end of a veth pair, named HostIface ("eth0") and addressed
// Subnet.base+i+1 (10.77.0.1, 10.77.0.2, ... by default); the other end
// ("p<i>") lives in the switch namespace as a port of the bridge. Nothing is
// ever created in the caller's (root) namespace: every link and address
// lives inside a namespace this package made, so interface names never
// collide with the machine's own and stay short whatever the prefix, and
// deleting the namespaces deletes every link with them.
//
// All kernel work goes through the `ip` program of iproute2 (netns add,
// link, addr, netns exec, netns pids); the package makes no system calls
// of its own.
//
// Ownership and lifetimes: a *Cluster owns the namespaces it created and
// nothing else. Commands made by (*Cluster).Command belong to the caller,
// who starts and waits for them; processes still running inside the
// namespaces when Close is called are killed by Close (SIGKILL to every
// pid `ip netns pids` reports), after which the namespaces are deleted and
// Close checks that no namespace with the prefix is left. Close is
// idempotent. If New fails part-way it removes what it made before
// returning. Cleanup removes every namespace with a prefix (after a crash);
// CleanupStale removes only those whose creating process is gone, so it is
// safe while other test binaries run.
//
// Available reports, once per process (the answer is cached), whether test
// hosts can be made here and, if not, why: not Linux, not root, no `ip`,
// or the kernel refusing namespaces, bridges or veth pairs. Callers decide
// whether that fails or skips a test; package netnstest holds the policy
// the project's tests use.
package netns
