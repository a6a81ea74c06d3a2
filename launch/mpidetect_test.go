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
