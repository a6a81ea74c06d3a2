package launch

import (
	"debug/elf"
	"fmt"
	"os"
	"strings"

	"github.com/fastpmi/fastpmi/agent/node"
)

// The interface a job's programs speak, when --mpi does not say
// (docs/pmix.md, "Selecting it"): the libraries each program names in
// its ELF dynamic section (DT_NEEDED). A program that links OpenPMIx
// (libpmix.so) or Open MPI (libmpi.so.40, Open MPI 3 to 5; its Fortran
// and C++ libraries too) speaks PMIx; one that links a PMI library
// (libpmi.so, libpmi2.so: Slurm's, libfastpmi) or MPICH (libmpich.so,
// MPICH's libmpi.so.12) speaks PMI. Anything else — a script, a static
// or Go program (fastpmi's client), a file pmirun cannot read, a program
// on another host that pmirun's own host does not have — says nothing,
// and the job is served PMI as before.

// progKind is what a program's linked libraries say it speaks.
type progKind uint8

const (
	kindUnknown progKind = iota
	kindPMI
	kindPMIx
)

// linkedKind classifies a program by its DT_NEEDED names; one that
// names both kinds says nothing.
func linkedKind(needed []string) (progKind, string) {
	var pmi, pmix string
	for _, n := range needed {
		switch {
		case strings.HasPrefix(n, "libpmix.so"), strings.HasPrefix(n, "libmpi") && strings.Contains(n, ".so.40"):
			pmix = n
		case strings.HasPrefix(n, "libpmi.so"), strings.HasPrefix(n, "libpmi2.so"),
			strings.HasPrefix(n, "libmpich.so"), strings.HasPrefix(n, "libmpi.so.12"):
			pmi = n
		}
	}
	switch {
	case pmix != "" && pmi == "":
		return kindPMIx, pmix
	case pmi != "" && pmix == "":
		return kindPMI, pmi
	}
	return kindUnknown, ""
}

// programKind reads path's DT_NEEDED entries.
func programKind(path string) (progKind, string) {
	f, err := elf.Open(path)
	if err != nil {
		return kindUnknown, ""
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		return kindUnknown, ""
	}
	return linkedKind(needed)
}

// detectMPI sets c.MPI from the programs when --mpi did not (pmix if
// one links PMIx and none links PMI), and refuses a job whose programs
// link PMIx and PMI both: their collectives cannot meet (docs/pmix.md,
// "Mixing PMI and PMIx ranks"). What it found goes to c.mpiFound, for
// --verbose. The programs are read once: a second call (validate after
// PMIxInProcess) returns at once.
func (c *Config) detectMPI() error {
	if c.mpiDetected {
		return nil
	}
	found, err := c.linkedMPI()
	if err != nil {
		return err
	}
	c.mpiFound, c.mpiDetected = found, true
	return nil
}

// linkedMPI is detectMPI's reading of the programs.
func (c *Config) linkedMPI() (string, error) {
	if c.Virtual != "" || (c.MPI != "" && len(c.Apps) == 0) {
		return "", nil // no programs, or one whose interface --mpi names
	}
	apps := c.Apps
	if c.Prog != "" {
		apps = []node.App{{Prog: c.Prog, Size: c.Size}}
	}
	env := append(os.Environ(), c.Env...)
	var pmix, pmi string // the first app of each kind, as "prog links lib"
	for _, a := range apps {
		path, err := a.Resolve(c.Wdir, append(env, a.Env...))
		if err != nil {
			continue
		}
		switch k, lib := programKind(path); k {
		case kindPMIx:
			if pmix == "" {
				pmix = fmt.Sprintf("%s links %s", a.Prog, lib)
			}
		case kindPMI:
			if pmi == "" {
				pmi = fmt.Sprintf("%s links %s", a.Prog, lib)
			}
		}
	}
	switch {
	case pmix != "" && pmi != "":
		return "", fmt.Errorf("%s (PMIx) and %s (PMI): one job's ranks cannot mix PMI and PMIx (docs/pmix.md)", pmix, pmi)
	case pmix != "" && c.MPI == "":
		c.MPI = node.MPIPMIx
		return "pmix (detected: " + pmix + ")", nil
	}
	return "", nil
}

// PMIxInProcess reports whether pmirun itself would serve the job's
// ranks over PMIx: its node runs inside pmirun (the fork bootstrap) and
// --mpi pmix is given or detected (recorded as validate records it). A
// pmirun built without PMIx hands such a job to the one built with it
// (cmd/pmirun). A command line validate refuses says false: Run reports it.
func (c *Config) PMIxInProcess() bool {
	if !c.nodeInProcess() {
		return false
	}
	if c.detectMPI() != nil {
		return false
	}
	return c.MPI == node.MPIPMIx
}
