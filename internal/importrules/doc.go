// Package importrules has no code, only tests: they hold fastpmi to its
// import rules, so that a stray import fails `go test` instead of waiting
// for a reviewer to notice it.
//
// The rules (one door to the kernel, and the binaries' dependency budget):
//
//   - pmid and pmirun do not link the client package (ranks link it; the
//     launcher and the agent serve PMI) nor the plotting library
//     (internal/benchplot, gonum/plot: figures are pmibench's), and the
//     client does not link the agent, the network transport, the launcher
//     or giouring;
//   - one door to the kernel: only internal/sys imports syscall or
//     golang.org/x/sys/unix;
//   - unsafe only in shm and internal/sys;
//   - cgo (import "C") only in agent/pmix (OpenPMIx's server library,
//     behind the pmix build tag) and clib/cfuzz (tests);
//   - giouring only in netio's _linux.go files, mmap-go only in shm;
//   - every package has a package doc comment, "Package x ..." or, for a
//     program, "Command x ...".
//
// The model: the tests ask the go command (go list -json) for the module's
// packages and the binaries' transitive dependencies, then parse the
// import block of every Go file of the module themselves, under every
// build constraint (Linux-only, other-platform and test files alike), so
// a rule holds on every platform, not only the one running the test.
// A failure names the offending package and file:line, and for a
// dependency the chain of imports that pulls it in.
package importrules
