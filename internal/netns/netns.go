package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"
)

// HostIface is the name of each host's link to the switch, inside the
// host's namespace.
const HostIface = "eth0"

// bridge is the name of the bridge inside the switch namespace.
const bridge = "br0"

// DefaultSubnet is the subnet hosts are addressed from when
// Config.Subnet is unset.
var DefaultSubnet = netip.MustParsePrefix("10.77.0.0/24")

// maxHosts bounds Config.Hosts (a Linux bridge takes at most 1024 ports).
const maxHosts = 1024

// teardownTimeout bounds Close and the clean-up functions.
const teardownTimeout = 30 * time.Second

// Errors.
var (
	// ErrUnavailable reports that test hosts cannot be made on this
	// machine; Available wraps it with the reason.
	ErrUnavailable = errors.New("network namespace test hosts unavailable")
	// ErrClosed reports the use of a closed Cluster.
	ErrClosed = errors.New("cluster closed")
	// ErrNoHost reports a host index outside the cluster.
	ErrNoHost = errors.New("no such host")
)

// Config describes a cluster of test hosts.
type Config struct {
	// Hosts is the number of host namespaces, at least 1.
	Hosts int
	// Prefix starts the name of every namespace the cluster makes
	// (Prefix+"sw", Prefix+"h0", ...). It must be unique to the test run,
	// for example "fpmit<pid>-1-" (see netnstest.Prefix); letters, digits,
	// '.', '_' and '-' only, at most 64 bytes. Interface names do not
	// depend on it.
	Prefix string
	// Subnet is the IPv4 private subnet hosts are addressed from: host i
	// gets the subnet's address + i + 1. Zero means DefaultSubnet.
	Subnet netip.Prefix
}

// validate fills defaults and rejects bad values.
func (c *Config) validate() error {
	if c.Hosts < 1 || c.Hosts > maxHosts {
		return fmt.Errorf("check config: hosts %d outside [1, %d]", c.Hosts, maxHosts)
	}
	if err := checkPrefix(c.Prefix); err != nil {
		return fmt.Errorf("check config: %w", err)
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	s := c.Subnet
	if !s.Addr().Is4() || !s.Addr().IsPrivate() {
		return fmt.Errorf("check config: subnet %s is not an IPv4 private range", s)
	}
	if s.Masked() != s {
		return fmt.Errorf("check config: subnet %s has host bits set (want %s)", s, s.Masked())
	}
	// Usable addresses: all but the network and broadcast addresses.
	if s.Bits() > 30 || c.Hosts > 1<<(32-s.Bits())-2 {
		return fmt.Errorf("check config: subnet %s holds fewer than %d hosts", s, c.Hosts)
	}
	return nil
}

// checkPrefix rejects a prefix that is empty (it would match every
// namespace), too long, or holds characters unfit for a namespace name.
func checkPrefix(p string) error {
	if p == "" || len(p) > 64 {
		return fmt.Errorf("check prefix %q: length %d outside [1, 64]", p, len(p))
	}
	for _, r := range p {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			r == '.' || r == '_' || r == '-'
		if !ok {
			return fmt.Errorf("check prefix %q: character %q not allowed", p, r)
		}
	}
	return nil
}

// Host is one test host.
type Host struct {
	Name string // name of the host's network namespace
	Addr string // IPv4 address of the host's HostIface, without length
}

// Cluster is a set of test hosts joined by one switch. Its methods are
// safe for concurrent use.
type Cluster struct {
	// Immutable after New.
	Hosts  []Host
	Switch string // name of the switch namespace
	prefix string
	bits   int // subnet length, for addresses

	// Guarded by mu.
	mu      sync.Mutex
	closed  bool
	created []string // namespaces made by this cluster, in order

	closeOnce sync.Once
	closeErr  error
}

// New makes the cluster cfg describes. On failure it removes whatever it
// made and returns the error (joined with any clean-up error).
func New(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	c := &Cluster{
		Switch: cfg.Prefix + "sw",
		prefix: cfg.Prefix,
		bits:   cfg.Subnet.Bits(),
	}
	addr := cfg.Subnet.Addr()
	for i := range cfg.Hosts {
		addr = addr.Next()
		c.Hosts = append(c.Hosts, Host{Name: cfg.Prefix + "h" + strconv.Itoa(i), Addr: addr.String()})
	}
	if err := c.build(ctx); err != nil {
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after failed setup: %w", cerr))
		}
		return nil, err
	}
	return c, nil
}

// build makes the switch, then each host and its link.
func (c *Cluster) build(ctx context.Context) error {
	sw := c.Switch
	if err := c.addNamespace(ctx, sw); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", sw, "link", "set", "lo", "up"},
		{"-n", sw, "link", "add", bridge, "type", "bridge", "stp_state", "0"},
		{"-n", sw, "link", "set", bridge, "up"},
	}
	if err := runSteps(ctx, "make switch "+sw, steps); err != nil {
		return err
	}
	for i, h := range c.Hosts {
		if err := c.addNamespace(ctx, h.Name); err != nil {
			return err
		}
		port := "p" + strconv.Itoa(i)
		steps := [][]string{
			{"-n", h.Name, "link", "set", "lo", "up"},
			// Both ends are made inside namespaces: eth0 in the host's,
			// the peer straight in the switch's.
			{"-n", h.Name, "link", "add", HostIface, "type", "veth", "peer", "name", port, "netns", sw},
			{"-n", h.Name, "addr", "add", h.Addr + "/" + strconv.Itoa(c.bits), "dev", HostIface},
			{"-n", h.Name, "link", "set", HostIface, "up"},
			{"-n", sw, "link", "set", port, "master", bridge, "up"},
		}
		if err := runSteps(ctx, fmt.Sprintf("make host %d (%s)", i, h.Name), steps); err != nil {
			return err
		}
	}
	return nil
}

// addNamespace makes namespace name and records it as the cluster's.
func (c *Cluster) addNamespace(ctx context.Context, name string) error {
	if _, err := runIP(ctx, "netns", "add", name); err != nil {
		return fmt.Errorf("add namespace %s: %w", name, err)
	}
	c.mu.Lock()
	c.created = append(c.created, name)
	c.mu.Unlock()
	return nil
}

func runSteps(ctx context.Context, what string, steps [][]string) error {
	for _, s := range steps {
		if _, err := runIP(ctx, s...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// host returns host i, or an error if i is out of range or c is closed.
func (c *Cluster) host(i int) (Host, error) {
	if i < 0 || i >= len(c.Hosts) {
		return Host{}, fmt.Errorf("select host %d of %d: %w", i, len(c.Hosts), ErrNoHost)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return Host{}, fmt.Errorf("select host %d: %w", i, ErrClosed)
	}
	return c.Hosts[i], nil
}

// Command returns a command that runs name with args inside host's
// namespace (through `ip netns exec`, which execs the program in place, so
// the command's process is the program itself). It inherits the
// environment unless the caller sets Env; ctx kills it as
// exec.CommandContext does. For a bad host or a closed cluster the
// command's Err is set, so Start returns that error.
func (c *Cluster) Command(ctx context.Context, host int, name string, args ...string) *exec.Cmd {
	h, err := c.host(host)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
	if err != nil {
		cmd.Err = err
	}
	return cmd
}

// Exec runs name with args inside host's namespace and returns its
// combined standard output and error.
func (c *Cluster) Exec(ctx context.Context, host int, name string, args ...string) ([]byte, error) {
	out, err := c.Command(ctx, host, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("run %s on host %d: %w", name, host, err)
	}
	return out, nil
}

// SetLink sets host's link to the switch down or up. Down, the host can
// neither send nor receive on it (its peers' connects time out); up again,
// its address and route come back and connections can be made anew.
func (c *Cluster) SetLink(host int, up bool) error {
	h, err := c.host(host)
	state := "down"
	if up {
		state = "up"
	}
	if err != nil {
		return fmt.Errorf("set link of host %d %s: %w", host, state, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	if _, err := runIP(ctx, "-n", h.Name, "link", "set", HostIface, state); err != nil {
		return fmt.Errorf("set link of host %d %s: %w", host, state, err)
	}
	return nil
}

// Close kills every process still running inside the cluster's
// namespaces, deletes the namespaces (and with them every veth and the
// bridge), and checks that no namespace starting with the prefix, nor any
// link so named in the caller's namespace, is left (naming apart any such
// namespace the cluster did not make). It is idempotent: later
// calls return the first call's result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		created := c.created
		c.mu.Unlock()
		c.closeErr = teardown(c.prefix, created)
	})
	return c.closeErr
}

// teardown removes the named namespaces and checks nothing with prefix is
// left. It does not use the caller's context: it must run even when that
// has ended.
func teardown(prefix string, names []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	var errs []error
	if err := removeNamespaces(ctx, names); err != nil {
		errs = append(errs, err)
	}
	if found, err := listNamespaces(ctx, prefix); err != nil {
		errs = append(errs, err)
	} else {
		var ours, others []string
		for _, name := range found {
			if slices.Contains(names, name) {
				ours = append(ours, name)
			} else {
				others = append(others, name)
			}
		}
		if len(ours) > 0 {
			errs = append(errs, fmt.Errorf("check clean-up: namespaces %v remain", ours))
		}
		if len(others) > 0 {
			errs = append(errs, fmt.Errorf("check clean-up: namespaces %v not made by this cluster use its prefix %q", others, prefix))
		}
	}
	if left, err := rootLinks(ctx, prefix); err != nil {
		errs = append(errs, err)
	} else if len(left) > 0 {
		errs = append(errs, fmt.Errorf("check clean-up: links %v remain", left))
	}
	return errors.Join(errs...)
}
