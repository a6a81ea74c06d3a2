// Command genlayout writes the shared-memory layout's constants, owned by
// package shm, as the C header libfastpmi compiles against
// (clib/fastpmi_layout.h). Run it through go generate in shm; the shm
// tests fail when the committed header differs from what it would write.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fastpmi/fastpmi/shm"
)

func main() {
	out := flag.String("o", "", "output file")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "usage: genlayout -o FILE")
		os.Exit(2)
	}
	if err := os.WriteFile(*out, shm.CHeader(), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "genlayout: %v\n", err)
		os.Exit(1)
	}
}
