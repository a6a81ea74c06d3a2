// Command gendocs writes the man pages of pmirun and pmid and pmirun's
// bash completion from the definitions their --help comes from
// (internal/cli's option table, internal/agentmain's usage), so the three
// cannot drift: "make docs" runs it, and its test fails when the
// committed files differ from what it would write.
//
//	go run ./internal/cli/gendocs [-root DIR]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fastpmi/fastpmi/internal/agentmain"
	"github.com/fastpmi/fastpmi/internal/cli"
)

// Files are the generated files, relative to the repository root, and
// their contents.
func Files() map[string][]byte {
	var pmirun, pmid, comp bytes.Buffer
	cli.Man(&pmirun)
	cli.ManFromUsage(&pmid, "pmid", "fastpmi's node agent", fmt.Sprintf(agentmain.Usage, "pmid"))
	cli.BashCompletion(&comp)
	return map[string][]byte{
		"docs/man/pmirun.1":                   pmirun.Bytes(),
		"docs/man/pmid.1":                     pmid.Bytes(),
		"contrib/bash-completion/pmirun.bash": comp.Bytes(),
	}
}

func main() {
	root := flag.String("root", ".", "repository root to write under")
	flag.Parse()
	for name, b := range Files() {
		p := filepath.Join(*root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
			os.Exit(1)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
			os.Exit(1)
		}
	}
}
