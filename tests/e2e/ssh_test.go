package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The ssh bootstrap with the real OpenSSH: every test host runs its own
// sshd (listening only on the host's address, keys made for the test),
// and pmirun, inside host 0, starts one pmid per host with the real ssh
// client. The client's options come in through --ssh, as a cluster's
// users would put them in ~/.ssh/config; the job's marker travels as an
// environment variable ssh sends and sshd accepts, so the survivor check
// covers the agents. The ranks get pmirun's environment (pmi2_test reads
// its EXPECT_ variables) and working directory (hello runs as ./hello),
// not the login's.

// sshHosts is sshd running in every host of a cluster.
type sshHosts struct {
	cmd   string   // --ssh: ssh with the test's client options
	addrs []string // each host's address, where its sshd listens
}

// startSSHDs starts sshd in every host of cl; cl's clean-up (which kills
// every process in its namespaces) and the test's stop them.
func startSSHDs(t *testing.T, cl *cluster) sshHosts {
	t.Helper()
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	if _, err := os.Stat(sshd); err != nil {
		t.Fatalf("sshd not found (%v): run make test, which installs openssh-server", err)
	}
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Fatalf("ssh-keygen not found (%v): run make test, which installs openssh-client", err)
	}
	// sshd refuses to start without its privilege separation directory,
	// which the package's service would make.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	for _, key := range []string{"host_key", "id"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path(key)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(path("id.pub"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"authorized_keys": string(pub),
		"sshd_config": strings.Join([]string{
			"Port 22",
			"HostKey " + path("host_key"),
			"AuthorizedKeysFile " + path("authorized_keys"),
			"PermitRootLogin prohibit-password",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"UsePAM no",
			"StrictModes no",
			"PidFile none",
			"AcceptEnv " + markerVar,
			"LogLevel ERROR",
		}, "\n") + "\n",
		"ssh_config": strings.Join([]string{
			"User root",
			"IdentityFile " + path("id"),
			"IdentitiesOnly yes",
			"StrictHostKeyChecking no",
			"UserKnownHostsFile /dev/null",
			"GlobalKnownHostsFile /dev/null",
			"ConnectTimeout 5",
			"LogLevel ERROR",
			"SendEnv " + markerVar,
		}, "\n") + "\n",
	}
	for name, text := range files {
		if err := os.WriteFile(path(name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := sshHosts{cmd: "ssh -F " + path("ssh_config")}
	for i, host := range cl.c.Hosts {
		cmd := cl.c.Command(context.Background(), i, sshd, "-D", "-e", "-f", path("sshd_config"), "-o", "ListenAddress="+host.Addr)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start sshd in %s: %v", host.Name, err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if s := stderr.String(); s != "" {
				t.Logf("sshd in %s: %s", host.Name, s)
			}
		})
		h.addrs = append(h.addrs, host.Addr)
	}
	// Every sshd answers a login from host 0, where pmirun will run.
	for _, addr := range h.addrs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			argv := append(strings.Fields(h.cmd), "-o", "BatchMode=yes", addr, "true")
			out, err := cl.c.Exec(context.Background(), 0, argv[0], argv[1:]...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ssh to %s from %s: %v\n%s", addr, cl.names[0], err, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return h
}

// job is a pmirun job inside host 0 over --bootstrap ssh to every host,
// on backend, with the hosts as given by hostArgs.
func (h sshHosts) job(cl *cluster, backend string, hostArgs []string, args ...string) job {
	a := append([]string{"--bootstrap", "ssh", "--ssh", h.cmd, "--root-addr", cl.c.Hosts[0].Addr, "--netio", backend}, hostArgs...)
	return job{
		args:       append(a, args...),
		wrap:       []string{"ip", "netns", "exec", cl.names[0]},
		markAgents: true,
		timeout:    40 * time.Second,
	}
}

func TestNetnsSSH(t *testing.T) {
	cl := newCluster(t)
	h := startSSHDs(t, cl)
	hostfile := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hostfile, []byte("# the test hosts\n"+strings.Join(h.addrs, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hosts := []string{"--hosts", strings.Join(h.addrs, ",")}
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Run("mpi_allreduce", func(t *testing.T) {
				r := run(t, h.job(cl, be, hosts, "--ppn", "4", "-n", "16", prog("mpi_allreduce")))
				r.wantCode(t, 0)
				r.wantAllreduce(t, 16)
			})
			t.Run("pmi2_test/hostfile", func(t *testing.T) {
				// --pmid names the agent binary on the hosts.
				j := h.job(cl, be, []string{"--hostfile", hostfile}, "--verbose", "--pmid", prog("pmid"), "-n", "8", prog("pmi2_test"))
				j.env = []string{"EXPECT_NNODES=4", "EXPECT_PLACEMENT=block", "PMI2_TEST_ALARM=30"}
				r := run(t, j)
				r.wantCode(t, 0)
				r.wantPMI2(t, 8, hostCount, false)
				r.wantRingMsgs(t, hostCount, 1)
				r.wantMessage(t, fmt.Sprintf("%d nodes via ssh", hostCount))
			})
			t.Run("hello", func(t *testing.T) {
				// From pmirun's working directory, as ./hello: the agents
				// start their ranks there, not in the login's home.
				j := h.job(cl, be, hosts, "--verbose", "-n", "8", "./hello")
				j.dir = filepath.Dir(prog("hello"))
				r := run(t, j)
				r.wantCode(t, 0)
				r.wantOneLine(t, helloLine)
				r.wantRingMsgs(t, hostCount, 1)
			})
		})
	}
	// Spawn: the children, on every host, run in the agents ssh started
	// for the first job; no ssh session starts for the spawn.
	t.Run("spawn", func(t *testing.T) {
		j := h.job(cl, "net", hosts, "--verbose", "--label", "-n", n(hostCount), prog("pmi2_spawn"))
		j.env = []string{"SPAWN_N=" + n(2*hostCount)}
		r := run(t, j)
		r.wantCode(t, 0)
		r.wantSpawn(t, hostCount, 2*hostCount)
		r.wantHosted(t, hostCount, 1)
	})
	// A host without sshd ends the job with ssh's error, naming the
	// host, instead of waiting for it.
	t.Run("unreachable", func(t *testing.T) {
		r := run(t, h.job(cl, "net", []string{"--hosts", h.addrs[1] + ",10.255.255.1"}, "-n", "2", prog("mpi_hello")))
		if r.code == 0 {
			t.Fatalf("exit 0 with an unreachable host\n%s", r)
		}
		r.wantMessage(t, "10.255.255.1")
		if r.elapsed > 2*time.Second {
			t.Errorf("the job took %v to end after ssh failed, want under 2s\n%s", r.elapsed, r)
		}
	})
}

// TestNetnsSSHMultihomed: pmirun on a machine of two networks, the first
// non-loopback address of its interfaces one the other hosts cannot reach
// (a management network, a link that is down, a service address on lo:
// here the last, which comes first), without --root-addr. The agents
// dial the address this machine reaches them from; they dialled the
// first address and never reached pmirun ('agent of node 1 ... exited
// before connecting').
func TestNetnsSSHMultihomed(t *testing.T) {
	cl := newCluster(t)
	h := startSSHDs(t, cl)
	if out, err := cl.c.Exec(context.Background(), 0, "ip", "addr", "add", "10.250.77.1/32", "dev", "lo"); err != nil {
		t.Fatalf("an address on lo in %s: %v\n%s", cl.names[0], err, out)
	}
	j := h.job(cl, "net", []string{"--hosts", strings.Join(h.addrs, ",")}, "-n", "8", prog("mpi_allreduce"))
	i := slices.Index(j.args, "--root-addr")
	j.args = slices.Delete(j.args, i, i+2)
	r := run(t, j)
	r.wantCode(t, 0)
	r.wantAllreduce(t, 8)
}
