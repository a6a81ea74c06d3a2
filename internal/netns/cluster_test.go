package netns_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/netns"
	"github.com/fastpmi/fastpmi/internal/netns/netnstest"
)

// The test binary doubles as the server and the client run inside the
// namespaces: these variables select the mode.
const (
	envMode    = "FASTPMI_NETNS_TEST_MODE" // "serve" or "dial"
	envAddr    = "FASTPMI_NETNS_TEST_ADDR" // listen or dial address
	envTag     = "FASTPMI_NETNS_TEST_TAG"  // serve: what to answer with
	envTimeout = "FASTPMI_NETNS_TEST_TIMEOUT"
	port       = "7077"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envMode) {
	case "serve":
		serve()
	case "dial":
		dial()
	}
	os.Exit(m.Run())
}

// serve listens on envAddr, prints "ready", and answers each connection
// with "TAG PEER-ADDRESS\n". It exits when its standard input closes.
func serve() {
	ln, err := net.Listen("tcp", os.Getenv(envAddr))
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "accept:", err)
			os.Exit(1)
		}
		fmt.Fprintf(conn, "%s %s\n", os.Getenv(envTag), conn.RemoteAddr())
		conn.Close()
	}
}

// dial connects to envAddr within envTimeout and prints the server's line.
func dial() {
	timeout, _ := time.ParseDuration(os.Getenv(envTimeout))
	conn, err := net.DialTimeout("tcp", os.Getenv(envAddr), timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "read:", err)
		os.Exit(1)
	}
	fmt.Print(line)
	os.Exit(0)
}

// helperEnv is the environment of the test binary run as a helper: the
// race runtime's default one-second pause at a clean exit is turned off.
func helperEnv() []string {
	return append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

func self(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// startServer runs the test binary in serve mode on host and returns the
// address it listens on. The server stops when the test ends.
func startServer(t *testing.T, c *netns.Cluster, host int, tag string) string {
	t.Helper()
	addr := net.JoinHostPort(c.Hosts[host].Addr, port)
	cmd := c.Command(context.Background(), host, self(t))
	cmd.Env = append(helperEnv(), envMode+"=serve", envAddr+"="+addr, envTag+"="+tag)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 2 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start server on host %d: %v", host, err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait() // killed by Close, or exited when stdin closed
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("server said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("start server on host %d: %v", host, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("start server on host %d: not ready after 10s", host)
	}
	return addr
}

// connect runs the test binary in dial mode on host from and returns the
// server's answer: its tag and the peer address it saw.
func connect(t *testing.T, c *netns.Cluster, from int, addr string, timeout time.Duration) (tag, peer string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	cmd := c.Command(ctx, from, self(t))
	cmd.Env = append(helperEnv(), envMode+"=dial", envAddr+"="+addr, envTimeout+"="+timeout.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("connect from host %d to %s: %w: %s", from, addr, err, strings.TrimSpace(string(out)))
	}
	tag, peer, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok {
		return "", "", fmt.Errorf("connect from host %d to %s: bad answer %q", from, addr, out)
	}
	return tag, peer, nil
}

// namespaces returns the named namespaces starting with prefix.
func namespaces(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("list namespaces: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names
}

func prefixOf(c *netns.Cluster) string { return strings.TrimSuffix(c.Switch, "sw") }

func TestTCPAcrossHosts(t *testing.T) {
	c := netnstest.New(t, 4)
	for i, h := range c.Hosts {
		if want := "10.77.0." + strconv.Itoa(i+1); h.Addr != want {
			t.Errorf("host %d address = %s, want %s", i, h.Addr, want)
		}
	}
	out, err := c.Exec(context.Background(), 2, "ip", "-o", "addr", "show", "dev", netns.HostIface)
	if err != nil || !strings.Contains(string(out), "inet 10.77.0.3/24") {
		t.Errorf("host 2 %s: %v: %s", netns.HostIface, err, out)
	}

	addr := startServer(t, c, 3, "h3")
	tag, peer, err := connect(t, c, 0, addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(peer)
	if err != nil || tag != "h3" || host != c.Hosts[0].Addr {
		t.Fatalf("server on host 3 answered %q %q, want h3 and a peer at %s", tag, peer, c.Hosts[0].Addr)
	}

	// Link down: the connect fails within its timeout.
	if err := c.SetLink(3, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, _, err := connect(t, c, 0, addr, 500*time.Millisecond); err == nil {
		t.Fatal("connect to host 3 with its link down succeeded")
	} else {
		t.Logf("link down: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("connect with the link down took %v to fail", d)
	}

	// Link up again: connects work again (allow the port a moment).
	if err := c.SetLink(3, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, err := connect(t, c, 0, addr, 500*time.Millisecond)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect after link up: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	c := netnstest.New(t, 2)
	prefix := prefixOf(c)
	// A process that leaves a child behind in host 1.
	cmd := c.Command(context.Background(), 1, "sh", "-c", "sleep 60 & exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []string
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 2; time.Sleep(20 * time.Millisecond) {
		out, err := exec.Command("ip", "netns", "pids", c.Hosts[1].Name).Output()
		if err != nil {
			t.Fatal(err)
		}
		pids = strings.Fields(string(out))
		if time.Now().After(deadline) {
			t.Fatalf("processes in host 1 = %v, want 2", pids)
		}
	}

	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err == nil {
			t.Error("process in host 1 exited cleanly, want killed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("process in host 1 still running after Close")
	}
	for _, pid := range pids {
		if stat, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil && !strings.Contains(string(stat), ") Z") {
			t.Errorf("process %s survived Close: %s", pid, stat)
		}
	}
	if left := namespaces(t, prefix); len(left) > 0 {
		t.Errorf("namespaces left after Close: %v", left)
	}
	for _, h := range append(slices.Clone(c.Hosts), netns.Host{Name: c.Switch}) {
		if _, err := os.Stat("/run/netns/" + h.Name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace file of %s: %v", h.Name, err)
		}
	}
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), prefix) {
		t.Errorf("links named %s* in the root namespace:\n%s", prefix, out)
	}

	// Idempotent, and the cluster refuses further use.
	if err := c.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := c.SetLink(0, false); !errors.Is(err, netns.ErrClosed) {
		t.Errorf("SetLink after Close = %v, want ErrClosed", err)
	}
	if err := c.Command(context.Background(), 0, "true").Run(); !errors.Is(err, netns.ErrClosed) {
		t.Errorf("Command after Close runs: %v, want ErrClosed", err)
	}
	if err := c.Command(context.Background(), 9, "true").Run(); !errors.Is(err, netns.ErrNoHost) {
		t.Errorf("Command on host 9 runs: %v, want ErrNoHost", err)
	}
}

func TestFailedSetupCleansUp(t *testing.T) {
	netnstest.Require(t)
	prefix := netnstest.Prefix()
	ctx := context.Background()

	// A bad config makes nothing.
	if _, err := netns.New(ctx, netns.Config{Hosts: 0, Prefix: prefix}); err == nil {
		t.Error("New with 0 hosts succeeded")
	}
	// A cancelled context stops setup at once.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := netns.New(cancelled, netns.Config{Hosts: 2, Prefix: prefix}); err == nil {
		t.Error("New with a cancelled context succeeded")
	}
	if left := namespaces(t, prefix); len(left) > 0 {
		t.Fatalf("namespaces left after failed New: %v", left)
	}

	// Setup fails half-way: host 2's name is taken.
	taken := prefix + "h2"
	if out, err := exec.Command("ip", "netns", "add", taken).CombinedOutput(); err != nil {
		t.Fatalf("add namespace %s: %v: %s", taken, err, out)
	}
	t.Cleanup(func() { _ = netns.Cleanup(prefix) })
	c, err := netns.New(ctx, netns.Config{Hosts: 4, Prefix: prefix})
	if err == nil {
		c.Close()
		t.Fatal("New over a taken namespace name succeeded")
	}
	t.Logf("New: %v", err)
	if !strings.Contains(err.Error(), "add namespace "+taken) {
		t.Errorf("New error does not name the step that failed: %v", err)
	}
	if left := namespaces(t, prefix); !slices.Equal(left, []string{taken}) {
		t.Errorf("namespaces after failed New = %v, want only the one made by the test, %s", left, taken)
	}
}

func TestTwoClustersCoexist(t *testing.T) {
	a := netnstest.New(t, 2)
	b := netnstest.New(t, 2)
	if a.Switch == b.Switch {
		t.Fatalf("both clusters use switch %s", a.Switch)
	}
	// Same subnet, same addresses: the clusters do not see each other.
	addrA := startServer(t, a, 1, "A")
	addrB := startServer(t, b, 1, "B")
	for _, x := range []struct {
		c    *netns.Cluster
		addr string
		want string
	}{{a, addrA, "A"}, {b, addrB, "B"}} {
		tag, _, err := connect(t, x.c, 0, x.addr, 2*time.Second)
		if err != nil || tag != x.want {
			t.Errorf("cluster %s: got %q, %v", x.want, tag, err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if left := namespaces(t, prefixOf(a)); len(left) > 0 {
		t.Errorf("cluster A left %v", left)
	}
	if got := namespaces(t, prefixOf(b)); len(got) != 3 {
		t.Errorf("cluster B namespaces after closing A = %v, want 3", got)
	}
	if tag, _, err := connect(t, b, 0, addrB, 2*time.Second); err != nil || tag != "B" {
		t.Errorf("cluster B after closing A: got %q, %v", tag, err)
	}
}

func TestCleanupStale(t *testing.T) {
	netnstest.Require(t)
	// A pid that no longer runs: a process that has exited and been reaped.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	// A base of its own, so that test binaries running at once do not meet.
	base := "fpmis" + strconv.Itoa(os.Getpid()) + "x"
	deadNS := base + strconv.Itoa(dead.Process.Pid) + "-1-h0"
	liveNS := netns.PrefixFor(base, "2") + "h0"
	odd := base + "x-h0"
	for _, n := range []string{deadNS, liveNS, odd} {
		if out, err := exec.Command("ip", "netns", "add", n).CombinedOutput(); err != nil {
			t.Fatalf("add namespace %s: %v: %s", n, err, out)
		}
	}
	t.Cleanup(func() { _ = netns.Cleanup(base) })

	if err := netns.CleanupStale(base); err != nil {
		t.Fatal(err)
	}
	if got := namespaces(t, base); !slices.Equal(got, []string{liveNS, odd}) && !slices.Equal(got, []string{odd, liveNS}) {
		t.Errorf("after CleanupStale: %v, want %s and %s", got, liveNS, odd)
	}
	if err := netns.Cleanup(base); err != nil {
		t.Fatal(err)
	}
	if got := namespaces(t, base); len(got) > 0 {
		t.Errorf("after Cleanup: %v", got)
	}
	if err := netns.Cleanup(""); err == nil {
		t.Error("Cleanup of the empty prefix was accepted")
	}
}
