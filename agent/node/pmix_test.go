package node

import (
	"errors"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/agent/pmix"
)

// --mpi takes pmi (also "") and pmix; pmix only from a build that can
// serve it, and a bad value names the choices.
func TestCheckMPI(t *testing.T) {
	for _, ok := range []string{"", MPIPMI} {
		if err := CheckMPI(ok); err != nil {
			t.Errorf("CheckMPI(%q): %v", ok, err)
		}
	}
	err := CheckMPI(MPIPMIx)
	if pmix.Supported != (err == nil) || (err != nil && !errors.Is(err, pmix.ErrNotSupported)) {
		t.Errorf("CheckMPI(pmix) = %v with PMIx support %v", err, pmix.Supported)
	}
	if err := CheckMPI("pmi2"); err == nil || !strings.Contains(err.Error(), "want pmi or pmix") {
		t.Errorf("CheckMPI(pmi2) = %v", err)
	}
}
