package launch

import "testing"

// What a program's DT_NEEDED names say it speaks.
func TestLinkedKind(t *testing.T) {
	for _, tc := range []struct {
		needed []string
		want   progKind
	}{
		{[]string{"libmpi.so.40", "libc.so.6"}, kindPMIx},         // Open MPI 4
		{[]string{"libmpi_mpifh.so.40", "libc.so.6"}, kindPMIx},   // Open MPI, Fortran
		{[]string{"libpmix.so.2", "libc.so.6"}, kindPMIx},         // OpenPMIx's client
		{[]string{"libmpich.so.12", "libc.so.6"}, kindPMI},        // MPICH
		{[]string{"libmpi.so.12", "libc.so.6"}, kindPMI},          // MPICH's libmpi
		{[]string{"libpmi2.so.0"}, kindPMI},                       // Slurm's libpmi2, libfastpmi
		{[]string{"libpmi.so.0"}, kindPMI},                        // PMI-1
		{[]string{"libmpich.so.12", "libpmix.so.2"}, kindUnknown}, // both: no opinion
		{[]string{"libc.so.6", "libpthread.so.0"}, kindUnknown},   // neither
		{nil, kindUnknown}, // static
	} {
		if got, _ := linkedKind(tc.needed); got != tc.want {
			t.Errorf("linkedKind(%q) = %d, want %d", tc.needed, got, tc.want)
		}
	}
	if k, _ := programKind("/nonexistent/prog"); k != kindUnknown {
		t.Error("a missing program has a kind")
	}
}

// pmirun serves PMIx itself only for a PMIx job whose node it runs: the
// fork bootstrap, no hosts, no daemons.
func TestPMIxInProcess(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{Config{Size: 1, Prog: "true", MPI: "pmix"}, true},
		{Config{Size: 1, Prog: "true", MPI: "pmix", Bootstrap: "fork"}, true},
		{Config{Size: 1, Prog: "true", MPI: "pmi"}, false},
		{Config{Size: 1, Prog: "true"}, false}, // detected: true links neither
		{Config{Size: 1, Prog: "true", MPI: "pmix", Bootstrap: "loopback", Nodes: 2}, false},
		{Config{Size: 1, Prog: "true", MPI: "pmix", Hosts: []string{"a"}}, false},
		{Config{Size: 1, Prog: "true", MPI: "pmix", Daemons: []string{"a:1"}}, false},
	} {
		if got := tc.cfg.PMIxInProcess(); got != tc.want {
			t.Errorf("%+v: PMIxInProcess = %v, want %v", tc.cfg, got, tc.want)
		}
	}
}
