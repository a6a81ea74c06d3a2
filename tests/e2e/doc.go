// Package e2e tests pmirun end to end with real clients: unmodified MPICH
// programs (PMI-1), programs linked against Slurm's libpmi2 (PMI-2 with
// PMIX_Ring) or libfastpmi, Open MPI and OpenPMIx programs (PMIx) and a
// hand-written PMI-1 client that fails on purpose, all in tests/cprog,
// and Go ranks of the client in this package's directories.
//
// TestMain builds pmirun (pure Go, as make builds it), pmirun-pmix, pmid
// and pmibench (with -tags pmix), the Go ranks, libfastpmi and the C
// programs into one temporary directory that lives as long as the test
// binary. Every job runs with a
// unique FASTPMI_TEST_MARKER in its ranks' environment (passed with
// pmirun --env), so a test can find the ranks of its own job in /proc and
// check that none outlives pmirun, whatever else runs on the machine.
//
// The package holds no code beside its tests; it needs mpicc.mpich (mpich,
// libmpich-dev), <slurm/pmi2.h> (libpmi2-0-dev), mpicc.openmpi and
// OpenPMIx (openmpi-bin, libopenmpi-dev, libpmix-dev: pmirun and pmid are
// built with -tags pmix), which `make test` installs.
package e2e
