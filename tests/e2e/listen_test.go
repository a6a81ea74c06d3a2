package e2e

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Strangers at a multi-node job's listeners, and the name service's cap.

// floodScript is a stranger in bash: it opens $1 connections to each
// address after $2, a third of them sending an HTTP request, a third
// binary garbage, a third nothing; says "flooded N" and holds them open
// until killed.
const floodScript = `trap '' PIPE
ulimit -n 16384 2>/dev/null || ulimit -n 4096
n=$1; shift
fds=()
for a in "$@"; do
  ip=${a%:*}; port=${a##*:}
  for i in $(seq 1 $n); do
    exec {fd}<>/dev/tcp/$ip/$port 2>/dev/null || continue
    case $((i % 3)) in
      1) printf 'GET / HTTP/1.1\r\nHost: x\r\n\r\n' >&$fd ;;
      2) printf '\x00\x00\x00\x20\xff\xf0\x00\x00garbage garbage garbage' >&$fd ;;
    esac
    fds+=($fd)
  done
done
echo "flooded ${#fds[@]}"
sleep 60`

// waitScript runs a rank: it says it is ready, waits for $GO_FILE, then
// runs its arguments (so PMI starts only then).
const waitScript = `echo "ready rank $PMI_RANK"
while [ ! -e "$GO_FILE" ]; do sleep 0.1; done
exec "$@"`

// listening returns the TCP sockets listening in host i of cl, as
// "ip:port", from /proc/net/tcp and /proc/net/tcp6 read inside it.
func listening(t *testing.T, cl *cluster, i int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := cl.c.Exec(ctx, i, "cat", "/proc/net/tcp", "/proc/net/tcp6")
	if err != nil {
		t.Fatalf("read the sockets of host %d: %v\n%s", i, err, out)
	}
	var addrs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] != "0A" { // TCP_LISTEN
			continue
		}
		hexIP, hexPort, _ := strings.Cut(f[1], ":")
		b, err1 := hex.DecodeString(hexIP)
		port, err2 := strconv.ParseUint(hexPort, 16, 16)
		if err1 != nil || err2 != nil || (len(b) != 4 && len(b) != 16) {
			t.Fatalf("host %d: unreadable socket line %q", i, l)
		}
		// The kernel prints each 32-bit word in host (little-endian) order.
		for w := 0; w < len(b); w += 4 {
			b[w], b[w+1], b[w+2], b[w+3] = b[w+3], b[w+2], b[w+1], b[w]
		}
		addrs = append(addrs, net.JoinHostPort(net.IP(b).String(), strconv.Itoa(int(port))))
	}
	return addrs
}

// A running multi-node job (3 test hosts, pmirun without --root-addr)
// listens only on each host's own address (loopback for the PMI port),
// never on every interface; a stranger on one of the hosts then opens
// 1,000 connections to each of its listeners, silent or sending garbage,
// and holds them while the ranks start and fetch a key from a node they
// have no link to (a link dialled during the flood). The job ends well,
// and pmirun's stderr (which carries the agents') holds a few refusal
// lines and summaries, not a line per connection. Before, the agents
// listened on every interface and each refusal was one log line.
func TestNetnsListenersFlood(t *testing.T) {
	const hosts, ranks, perListener = 3, 6, 1000
	cl := newClusterOf(t, hosts)
	dir := t.TempDir()
	goFile := filepath.Join(dir, "go")
	j := job{
		args: []string{"--bootstrap", "netns", "--hosts", strings.Join(cl.names, ","), "--netio", "net",
			"--get-strategy", "direct", "-n", n(ranks),
			"bash", "-c", waitScript, "wait", prog("kvsprog"), "-pattern", "bcast", "-src"},
		env:        []string{"GO_FILE=" + goFile},
		wrap:       []string{"ip", "netns", "exec", cl.names[0]},
		markAgents: true,
		timeout:    90 * time.Second,
	}
	r := start(t, j)
	r.waitStdout(30*time.Second, func(ls []string) bool {
		k := 0
		for _, l := range ls {
			if strings.HasPrefix(l, "ready rank ") {
				k++
			}
		}
		return k == ranks
	})

	var targets []string
	for i, h := range cl.c.Hosts {
		for _, a := range listening(t, cl, i) {
			host, port, _ := net.SplitHostPort(a)
			switch host {
			case h.Addr:
				targets = append(targets, a)
			case "127.0.0.1":
			default:
				t.Errorf("host %d (%s): a socket listens on %s", i, h.Addr, a)
				if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
					targets = append(targets, net.JoinHostPort(h.Addr, port)) // flood it all the same
				}
			}
		}
	}
	// pmirun's, and two of every agent's: its peers' links, and the
	// run's spawned jobs it hosts (internal/agentmain/host.go).
	if len(targets) != 1+2*hosts {
		t.Errorf("%d listeners reachable at the hosts' addresses, want %d (pmirun's and two of each of %d agents): %v", len(targets), 1+2*hosts, hosts, targets)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	flood := cl.c.Command(ctx, hosts-1, "bash", "-c", floodScript, "flood", strconv.Itoa(perListener))
	flood.Args = append(flood.Args, targets...)
	out, err := flood.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := flood.Start(); err != nil {
		t.Fatalf("start the flood: %v", err)
	}
	defer func() {
		flood.Process.Kill()
		flood.Wait()
	}()
	line, _ := bufio.NewReader(out).ReadString('\n')
	var opened int
	if _, err := fmt.Sscanf(line, "flooded %d", &opened); err != nil || opened < perListener*len(targets)/2 {
		t.Fatalf("the flood opened too few connections: %q", line)
	}
	t.Logf("a stranger holds %d connections to %d listeners", opened, len(targets))
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := r.wait()
	res.wantCode(t, 0)
	if !strings.Contains(res.stdout, fmt.Sprintf("kvsprog ok: bcast, %d ranks", ranks)) {
		t.Errorf("kvsprog did not report success\n%s", res)
	}
	// At most one line per listener and kind of refusal (4), and at
	// least one summary; the counts add up to most of the flood (the
	// garbage is refused at once; silent ones still waiting when a
	// listener closes are not counted).
	if k := strings.Count(res.stderr, "refused connection"); k > 4*len(targets) {
		t.Errorf("%d refusals logged one by one for %d connections\n%s", k, opened, clip(res.stderr))
	}
	total := 0
	for _, m := range regexp.MustCompile(`refused (\d+) connections before authentication`).FindAllStringSubmatch(res.stderr, -1) {
		k, _ := strconv.Atoi(m[1])
		total += k
	}
	t.Logf("pmirun's stderr: %d refusals logged one by one, summaries count %d", strings.Count(res.stderr, "refused connection"), total)
	if total < opened/2 {
		t.Errorf("the summaries count %d refusals of %d connections\n%s", total, opened, clip(res.stderr))
	}
}

// pmi1NamesScript publishes names over PMI-1 on PMI_FD (rank 0) until
// one is refused, then looks up the first and checks the job goes on (a
// barrier of every rank).
const pmi1NamesScript = `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD
if [ "$PMI_RANK" = 0 ]; then
  n=0
  while [ $n -lt 10000 ]; do
    printf 'cmd=publish_name service=cap-%d port=port\n' $n >&$PMI_FD; read -r l <&$PMI_FD
    case "$l" in *rc=0*) n=$((n+1));; *) echo "refused after $n: $l"; break;; esac
  done
  printf 'cmd=lookup_name service=cap-0\n' >&$PMI_FD; read -r l <&$PMI_FD; echo "lookup: $l"
fi
printf 'cmd=barrier_in\n' >&$PMI_FD; read -r l <&$PMI_FD
printf 'cmd=finalize\n' >&$PMI_FD; read -r l <&$PMI_FD
echo "rank $PMI_RANK done"`

// pmi2NamesScript is the same over PMI-2 (length-prefixed frames).
const pmi2NamesScript = `send() { printf '%-6d%s' ${#1} "$1" >&$PMI_FD; }
recv() { read -r -N 6 len <&$PMI_FD; read -r -N $len l <&$PMI_FD; }
printf 'cmd=init pmi_version=2 pmi_subversion=0\n' >&$PMI_FD; read -r l <&$PMI_FD
send "cmd=fullinit;pmirank=$PMI_RANK;"; recv
if [ "$PMI_RANK" = 0 ]; then
  n=0
  while [ $n -lt 10000 ]; do
    send "cmd=name-publish;name=cap-$n;port=port;"; recv
    case "$l" in *\;rc=0\;*) n=$((n+1));; *) echo "refused after $n: $l"; break;; esac
  done
  send "cmd=name-lookup;name=cap-0;"; recv; echo "lookup: $l"
fi
send "cmd=fence;"; recv
send "cmd=finalize;"; recv
echo "rank $PMI_RANK done"`

// A job publishes at most 4,096 names (agent.MaxNamesPerJob): the next
// publish is refused with rc≠0 and "quota exceeded", over PMI-1, PMI-2
// and the Go client on shared memory, on one node, with agents and on
// daemons; the names already published still resolve and the job ends
// well. Before, the name service took names without bound.
func TestNameServiceCap(t *testing.T) {
	const limit = 4096
	refusedText := regexp.MustCompile(`refused after 4096: .*rc=-?[1-9][0-9]*.*quota.exceeded`)
	lookupText := regexp.MustCompile(`(?m)^lookup: .*rc=0.*port=port`)
	textCheck := func(t *testing.T, r result) {
		t.Helper()
		r.wantCode(t, 0)
		if !refusedText.MatchString(r.stdout) || !lookupText.MatchString(r.stdout) ||
			!strings.Contains(r.stdout, "rank 0 done") || !strings.Contains(r.stdout, "rank 1 done") {
			t.Errorf("want publish %d refused with quota exceeded, the first still found, every rank done\n%s", limit+1, r)
		}
	}
	goCheck := func(t *testing.T, r result) {
		t.Helper()
		r.wantCode(t, 0)
		if !regexp.MustCompile(`r=0 namecap published=4096 refused=.*quota exceeded`).MatchString(r.stdout) ||
			!strings.Contains(r.stdout, "r=0 namecap lookup=port err=<nil>") {
			t.Errorf("want publish %d refused with quota exceeded, the first still found\n%s", limit+1, r)
		}
	}
	boots := map[string][]string{"fork": nil, "loopback": {"--bootstrap", "loopback", "--nodes", "2"}}
	for _, name := range []string{"fork", "loopback"} {
		boot := boots[name]
		t.Run(name+"/pmi1", func(t *testing.T) {
			textCheck(t, run(t, job{args: append(append([]string{}, boot...), "-n", "2", "bash", "-c", pmi1NamesScript)}))
		})
		t.Run(name+"/pmi2", func(t *testing.T) {
			textCheck(t, run(t, job{args: append(append([]string{}, boot...), "-n", "2", "bash", "-c", pmi2NamesScript)}))
		})
		t.Run(name+"/shm", func(t *testing.T) {
			goCheck(t, run(t, job{args: append(append([]string{}, boot...), "-n", "2", prog("conform"), "namecap")}))
		})
	}
	t.Run("daemons/pmi1", func(t *testing.T) {
		p := newDaemonPair(t)
		textCheck(t, run(t, p.job("-n", "2", "bash", "-c", pmi1NamesScript)))
		// The run's names went with it: the next run may publish as many.
		textCheck(t, run(t, p.job("-n", "2", "bash", "-c", pmi1NamesScript)))
	})
}

// strangers opens n connections to addr from the test process, a third
// sending an HTTP request, a third binary garbage, a third nothing, and
// returns them (to be closed by the caller).
func strangers(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Logf("stranger %d of %d to %s: %v", i, n, addr, err)
			continue
		}
		switch i % 3 {
		case 1:
			c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		case 2:
			c.Write([]byte("\x00\x00\x00\x20\xff\xf0\x00\x00garbage garbage garbage"))
		}
		cs = append(cs, c)
	}
	return cs
}

// A stranger holding 1,000 connections to each of two daemons, silent or
// sending garbage, does not keep pmirun from submitting a job to them:
// the job runs, pmid --status counts the strangers dropped, and each
// daemon logs a few refusal lines and a summary when it stops, not a line
// per connection. Before, the silent
// connections took every handshake slot of a daemon for 10 s and
// pmirun's own connection was refused.
func TestDaemonFlood(t *testing.T) {
	const perDaemon = 1000
	p := newDaemonPair(t)
	var cs []net.Conn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	opened := make([]int, len(p.d))
	for i, d := range p.d {
		c := strangers(t, d.addr, perDaemon)
		opened[i] = len(c)
		cs = append(cs, c...)
	}
	if len(cs) < perDaemon {
		t.Fatalf("the flood opened %d connections", len(cs))
	}
	r := run(t, p.job("-n", "4", prog("mpi_allreduce")))
	r.wantCode(t, 0)
	r.wantAllreduce(t, 4)
	// pmid --status counts the strangers it dropped: all but those still
	// in a handshake slot (256, silent ones whose 2 s are not over), at
	// most every one.
	for i, d := range p.d {
		n := int64(opened[i])
		if st := d.status(t, p.secret); st.Strangers < n-256-8 || st.Strangers > n {
			t.Errorf("daemon %s counts %d strangers dropped, of %d", d.addr, st.Strangers, n)
		}
	}
	for _, d := range p.d {
		if code := d.stop(t, 20*time.Second); code != 0 {
			t.Errorf("daemon %s exited %d", d.addr, code)
		}
		log := d.stderr.String()
		if k := strings.Count(log, "refused connection"); k > 4 {
			t.Errorf("daemon %s logged %d refusals one by one\n%s", d.addr, k, clip(log))
		}
		if !regexp.MustCompile(`refused \d+ connections before authentication`).MatchString(log) {
			t.Errorf("daemon %s logged no summary of its refusals\n%s", d.addr, clip(log))
		}
	}
}
