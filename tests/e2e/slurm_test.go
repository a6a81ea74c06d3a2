package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/slurmconf"
)

// The Slurm bootstrap on a real Slurm: a munged for the test (its own key
// and socket), slurmctld in host 0 and a slurmd in every test host, each
// in its own UTS namespace named after its host so that it knows which
// node it is, with every file the daemons write in the test's directory.
// pmirun runs under salloc in host 0 and starts its agents with srun
// --mpi=none: no Slurm MPI plugin takes part. The ranks (MPICH, libpmi2,
// the Go client) talk to pmid only.

// slurmCluster is Slurm running on a cluster's hosts.
type slurmCluster struct {
	conf string // SLURM_CONF
}

// startSlurm starts munged, slurmctld and the slurmds, and waits until
// every node is idle.
func startSlurm(t *testing.T, cl *cluster) slurmCluster {
	t.Helper()
	for _, tool := range []string{"munged", "slurmctld", "slurmd", "salloc", "srun", "sinfo", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (%v): run make test, which installs munge, slurmctld, slurmd and slurm-client", tool, err)
		}
	}
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	var procs []*exec.Cmd
	// Registered after TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		for _, p := range procs {
			p.Process.Kill()
			p.Wait()
		}
	})
	startDaemon := func(name string, cmd *exec.Cmd) {
		t.Helper()
		log, err := os.Create(path(name + ".out"))
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		cmd.Stdout, cmd.Stderr = log, log
		cmd.Env = append(os.Environ(), "SLURM_CONF="+path("slurm.conf"))
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		procs = append(procs, cmd)
	}

	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("munge.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := path("munge.sock")
	startDaemon("munged", exec.Command("munged", "--foreground", "--force", "--key-file="+path("munge.key"), "--socket="+sock,
		"--pid-file="+path("munged.pid"), "--log-file="+path("munged.log"), "--seed-file="+path("munged.seed")))

	var nodes []string
	for _, h := range cl.c.Hosts {
		if err := os.MkdirAll(filepath.Join(dir, "spool", h.Name), 0o700); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, fmt.Sprintf("NodeName=%s NodeAddr=%s CPUs=1 State=UNKNOWN", h.Name, h.Addr))
	}
	conf := strings.Join(append(append(slices.Clone(slurmconf.Fixed),
		"ClusterName=fastpmi",
		fmt.Sprintf("SlurmctldHost=%s(%s)", cl.c.Hosts[0].Name, cl.c.Hosts[0].Addr),
		"AuthInfo=socket="+sock,
		"StateSaveLocation="+path("state"),
		"SlurmdSpoolDir="+filepath.Join(dir, "spool", "%n"),
		"SlurmctldPidFile="+path("slurmctld.pid"),
		"SlurmdPidFile="+path("slurmd.%n.pid"),
		"SlurmctldLogFile="+path("slurmctld.log"),
		"SlurmdLogFile="+path("slurmd.%n.log"),
	), append(nodes, "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP")...), "\n") + "\n"
	cgroup := slurmconf.Cgroup(path("cgroup"))
	for name, text := range map[string]string{"slurm.conf": conf, "cgroup.conf": cgroup} {
		if err := os.WriteFile(path(name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"state", "cgroup"} {
		if err := os.MkdirAll(path(d), 0o700); err != nil {
			t.Fatal(err)
		}
	}

	// Each daemon in its host, under its host's name.
	inHost := func(i int, argv ...string) *exec.Cmd {
		sh := append([]string{"unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, cl.c.Hosts[i].Name}, argv...)
		return cl.c.Command(context.Background(), i, sh[0], sh[1:]...)
	}
	startDaemon("slurmctld", inHost(0, "slurmctld", "-D", "-i"))
	for i, h := range cl.c.Hosts {
		startDaemon("slurmd."+h.Name, inHost(i, "slurmd", "-D"))
	}

	s := slurmCluster{conf: path("slurm.conf")}
	deadline := time.Now().Add(20 * time.Second)
	for {
		cmd := cl.c.Command(context.Background(), 0, "sinfo", "--noheader", "--format=%T %D")
		cmd.Env = append(os.Environ(), "SLURM_CONF="+s.conf)
		out, err := cmd.CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == fmt.Sprintf("idle %d", hostCount) {
			break
		}
		if time.Now().After(deadline) {
			logs, _ := exec.Command("sh", "-c", "tail -n 5 "+path("*.out")+" "+path("*.log")).CombinedOutput()
			t.Fatalf("Slurm nodes not idle within 20s: sinfo %q (%v)\n%s", out, err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s
}

// job is a pmirun job under salloc in host 0 over --bootstrap slurm, on
// backend.
func (s slurmCluster) job(cl *cluster, backend string, args ...string) job {
	return job{
		args:       append([]string{"--bootstrap", "slurm", "--root-addr", cl.c.Hosts[0].Addr, "--netio", backend}, args...),
		env:        []string{"SLURM_CONF=" + s.conf},
		wrap:       []string{"ip", "netns", "exec", cl.names[0], "salloc", "--quiet", "--nodes", fmt.Sprint(hostCount)},
		markAgents: true,
		timeout:    40 * time.Second,
	}
}

func TestNetnsSlurm(t *testing.T) {
	cl := newCluster(t)
	s := startSlurm(t, cl)
	for _, be := range backends {
		t.Run(be, func(t *testing.T) {
			t.Run("mpi_allreduce", func(t *testing.T) {
				r := run(t, s.job(cl, be, "--ppn", "4", "-n", "16", prog("mpi_allreduce")))
				r.wantCode(t, 0)
				r.wantAllreduce(t, 16)
			})
			t.Run("pmi2_test", func(t *testing.T) {
				j := s.job(cl, be, "--verbose", "--cyclic", "-n", "8", prog("pmi2_test"))
				j.env = append(j.env, "EXPECT_NNODES=4", "EXPECT_PLACEMENT=cyclic", "PMI2_TEST_ALARM=30")
				r := run(t, j)
				r.wantCode(t, 0)
				r.wantPMI2(t, 8, hostCount, true)
				r.wantRingMsgs(t, hostCount, 1)
				r.wantMessage(t, fmt.Sprintf("%d nodes via slurm", hostCount))
				// Each agent ran under its host's slurmd: it reports the
				// host's name (the slurmd's UTS namespace) and address.
				for i, h := range cl.c.Hosts {
					r.wantMessage(t, fmt.Sprintf(`node %d \(%s, pid \d+\) up at %s:`, i, h.Name, regexp.QuoteMeta(h.Addr)))
				}
			})
			t.Run("hello", func(t *testing.T) {
				r := run(t, s.job(cl, be, "--verbose", "-n", "8", prog("hello")))
				r.wantCode(t, 0)
				r.wantOneLine(t, helloLine)
				r.wantRingMsgs(t, hostCount, 1)
			})
		})
	}
	// As srun: without -n a rank a node of the allocation, and a job of
	// fewer ranks than nodes runs on the first nodes (both were refused:
	// "every node needs at least one rank").
	t.Run("placement", func(t *testing.T) {
		for _, args := range [][]string{{}, {"-n", "2"}} {
			r := run(t, s.job(cl, "net", append(args, "-l", "hostname")...))
			r.wantCode(t, 0)
			size := hostCount
			if len(args) > 0 {
				size = 2
			}
			r.wantRankLines(t, size, func(rank int) string { return fmt.Sprintf("[%d] %s", rank, cl.names[rank]) })
		}
	})
	// Without --bootstrap inside the allocation, as Hydra and Open MPI's
	// mpirun run it: the allocation's nodes, a rank each (it ran one
	// rank on host 0 alone, exit 0).
	t.Run("allocation detected", func(t *testing.T) {
		j := s.job(cl, "net", "-l", "hostname")
		j.args = j.args[2:] // no --bootstrap slurm
		r := run(t, j)
		r.wantCode(t, 0)
		r.wantRankLines(t, hostCount, func(rank int) string { return fmt.Sprintf("[%d] %s", rank, cl.names[rank]) })
	})
	// The job's input reaches its stdin rank on any node (-i 2 read
	// nothing), and all of it while the other nodes' agents, fed it by
	// srun's --input=all too, leave it be (16 MiB stopped part way and
	// waited for the job's timeout).
	t.Run("stdin", func(t *testing.T) {
		j := s.job(cl, "net", "-i", "2", "-n", "4", "-l", "sh", "-c", `read x; echo "$x"`)
		j.stdin = strings.NewReader("hello\n")
		r := run(t, j)
		r.wantCode(t, 0)
		r.wantRankLines(t, 4, func(rank int) string { return fmt.Sprintf("[%d] %s", rank, map[bool]string{true: "hello"}[rank == 2]) })
		const size = 16 << 20
		j = s.job(cl, "net", "-n", "4", "sh", "-c", `if [ "$PMI_RANK" = 0 ]; then wc -c; fi`)
		j.stdin = strings.NewReader(strings.Repeat("x", size))
		j.timeout = 20 * time.Second
		r = run(t, j)
		r.wantCode(t, 0)
		if got := strings.TrimSpace(r.stdout); got != fmt.Sprint(size) {
			t.Errorf("rank 0 read %q bytes, want %d\n%s", got, size, r)
		}
	})
	// No pmid on the nodes: srun's step fails on every node, and pmirun
	// says so (it said node 0's agent had exited).
	t.Run("no pmid", func(t *testing.T) {
		r := run(t, s.job(cl, "net", "--pmid", "/nonexistent/pmid", "-n", "4", "true"))
		r.wantCode(t, 1)
		r.wantMessage(t, `^pmirun: srun, which runs every node's agent, exited before they connected: exit status \d+$`)
	})
	// Spawn: each child job runs on the child's nodes — all of them, or
	// (2 + 1 children) the first three — in the agents the allocation's
	// step started for the first job: no step starts for a spawn.
	for _, kids := range []int{2 * hostCount, 2} {
		t.Run(fmt.Sprintf("spawn/%d", kids), func(t *testing.T) {
			j := s.job(cl, "net", "--verbose", "--label", "-n", n(hostCount), prog("pmi2_spawn"))
			j.env = append(j.env, "SPAWN_N="+n(kids))
			r := run(t, j)
			r.wantCode(t, 0)
			r.wantSpawn(t, hostCount, kids)
			r.wantHosted(t, hostCount, 1)
		})
	}
}
