package node

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/fastpmi/fastpmi/agent/pmix"
	"github.com/fastpmi/fastpmi/internal/guard"
)

// MPI interfaces (Spec.MPI).
const (
	MPIPMI  = "pmi"  // PMI-1 and PMI-2 (text protocol, shared memory): the default
	MPIPMIx = "pmix" // PMIx too, through OpenPMIx's server library
)

// ErrNoPMIx is CheckMPI's answer for --mpi pmix in a build without PMIx.
var ErrNoPMIx = fmt.Errorf("--mpi pmix: %w", pmix.ErrNotSupported)

// CheckMPI checks a Spec.MPI value and that this build can serve it.
func CheckMPI(mpi string) error {
	switch mpi {
	case "", MPIPMI:
		return nil
	case MPIPMIx:
		if !pmix.Supported {
			return ErrNoPMIx
		}
		return nil
	}
	return fmt.Errorf("invalid --mpi %q: want %s or %s", mpi, MPIPMI, MPIPMIx)
}

// startPMIx makes the node's PMIx front end when the job asks for one:
// each rank then gets its PMIx environment next to its PMI one, and PMIx
// requests become operations of the same agent (agent/pmix).
func (n *Node) startPMIx() error {
	if err := CheckMPI(n.spec.MPI); err != nil {
		return err
	}
	if n.spec.MPI != MPIPMIx {
		return nil
	}
	if n.opt.Starter != nil {
		return fmt.Errorf("--mpi %s: ranks played in the agent speak fastpmi's own client only", MPIPMIx)
	}
	var appnum []int
	if len(n.spec.Apps) > 1 {
		appnum = make([]int, n.spec.Size)
		for r := range appnum {
			appnum[r] = n.spec.App(r)
		}
	}
	var parent *pmix.Proc
	if n.spec.SpawnerJobID != "" {
		parent = &pmix.Proc{Nspace: n.spec.SpawnerJobID, Rank: n.spec.SpawnerRank}
	}
	hosts := n.opt.Hosts
	if hosts == nil && len(n.spec.Nodes) == 1 {
		hosts = []string{hostName(n.opt)}
	}
	j, err := pmix.NewJob(pmix.Config{
		Agent: n.ag, Nspace: n.spec.JobID, Size: n.spec.Size, Usize: n.spec.Usize,
		Nodes: n.spec.Nodes, Index: n.opt.Index, Hosts: hosts, Appnum: appnum,
		Parent: parent, Logger: n.opt.Logger,
	})
	if err != nil {
		return err
	}
	n.pmix = j
	env := slices.Clone(ompiDirectLaunch)
	if !hasEnv(n.env, ompiShmDirVar) {
		// Open MPI names its shared-memory files by host name, job and
		// local rank: nodes that share a host name and /dev/shm (test
		// hosts, agents of one machine) would collide, and a rank that is
		// killed leaves its files behind. A directory per node and job,
		// removed at Close, avoids both. It is also where the ranks
		// make Open MPI's session directories (ompi.HOST.UID/jf.*/...,
		// under $TMPDIR otherwise), which only an mpirun removes: every
		// job left its own in /tmp.
		base := "/dev/shm"
		if st, err := os.Stat(base); err != nil || !st.IsDir() {
			base = ""
		}
		dir, err := os.MkdirTemp(base, "fastpmi-ompi-")
		if err != nil {
			n.closePMIx()
			return fmt.Errorf("--mpi %s: directory for the ranks' shared memory: %w", MPIPMIx, err)
		}
		n.pmixDir = dir
		guard.AddDir(dir) // removed by the guard if this process is killed
		env = append(env, ompiShmDirVar+"="+dir, ompiTmpdirVar+"="+dir)
	}
	if n.oversubscribed {
		// More ranks than CPUs: Open MPI's ranks should yield while they
		// wait instead of spinning, as they do when its mpirun says so.
		env = append(env, "OMPI_MCA_mpi_oversubscribe=1")
	}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !hasEnv(n.env, k) {
			n.env = append(n.env, kv)
		}
	}
	return nil
}

// ompiShmDirVar is where Open MPI's shared-memory transport (vader)
// puts its files.
const ompiShmDirVar = "OMPI_MCA_btl_vader_backing_directory"

// ompiTmpdirVar is where Open MPI 4.1's ranks make their session
// directories.
const ompiTmpdirVar = "OMPI_MCA_orte_tmpdir_base"

// closePMIx ends the node's PMIx front end, if any, and removes its
// directory.
func (n *Node) closePMIx() {
	if n.pmix != nil {
		n.pmix.Close()
	}
	if n.pmixDir != "" {
		os.RemoveAll(n.pmixDir)
		guard.RemoveDir(n.pmixDir)
	}
}

// ompiDirectLaunch are what Open MPI 4.1 needs to know it was launched
// by a PMIx server that is not Slurm's: its ORTE personality ("schizo"
// orte) declares any process without an mpirun daemon a singleton and
// starts an HNP of its own, unless it is left out and the PMIx
// environment module (ess pmi) chosen. A variable the job's environment
// already sets is left as it is. Open MPI 5 (PRRTE) reads PMIx directly
// and has neither framework.
var ompiDirectLaunch = []string{"OMPI_MCA_schizo=^orte", "OMPI_MCA_ess=pmi"}

// hasEnv reports whether env sets key.
func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}
