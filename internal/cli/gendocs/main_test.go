package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/internal/cli"
)

// The committed man pages and completion are what gendocs writes now:
// run "make docs" after changing an option.
func TestGeneratedFilesCurrent(t *testing.T) {
	for name, want := range Files() {
		got, err := os.ReadFile(filepath.Join("..", "..", "..", name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not what gendocs writes (%v): run make docs", name, err)
		}
	}
}

// The man page is valid roff that man(1)'s formatter renders with every
// option; the completion is valid bash that offers options and choices.
func TestGeneratedFilesWork(t *testing.T) {
	files := Files()
	if groff, err := exec.LookPath("groff"); err == nil {
		cmd := exec.Command(groff, "-man", "-Tascii", "-P-cbou", "-Wall")
		cmd.Stdin = bytes.NewReader(files["docs/man/pmirun.1"])
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("groff: %v\n%s", err, stderr.String())
		}
		text := string(out)
		for _, f := range cli.Flags() {
			for _, n := range f.Names {
				if !strings.Contains(text, n) {
					t.Errorf("rendered man page lacks %s", n)
				}
			}
		}
	} else {
		t.Log("groff not installed: the man page's rendering is not checked")
	}
	script := filepath.Join(t.TempDir(), "c.bash")
	os.WriteFile(script, files["contrib/bash-completion/pmirun.bash"], 0o644)
	for line, want := range map[string]string{
		"pmirun -bind-to h":   "hwthread",
		"pmirun --compress z": "zstd",
		"pmirun -gen":         "-genvall",
		"pmirun -n 2 --std":   "--stdin",
	} {
		words := strings.Fields(line)
		prog := `source ` + script + `; COMP_WORDS=(` + line + `); COMP_CWORD=` + itoa(len(words)-1) + `; _pmirun; printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command("bash", "-c", prog).CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("completing %q: %v %q, want %q", line, err, out, want)
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// Every test docs/cli.md names for a row exists where it says.
func TestCLIDocTestsExist(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"cli": "internal/cli", "launch": "launch", "node": "agent/node", "e2e": "tests/e2e", "version": "internal/version"}
	re := regexp.MustCompile(`\b(cli|launch|node|e2e|version)/(Test\w+)`)
	ms := re.FindAllStringSubmatch(string(doc), -1)
	if len(ms) < 30 {
		t.Fatalf("docs/cli.md names %d tests, want the table's", len(ms))
	}
	for _, m := range ms {
		files, _ := filepath.Glob(filepath.Join(root, dirs[m[1]], "*_test.go"))
		found := false
		for _, f := range files {
			b, _ := os.ReadFile(f)
			found = found || bytes.Contains(b, []byte("func "+m[2]+"("))
		}
		if !found {
			t.Errorf("docs/cli.md names %s/%s, which %s does not have", m[1], m[2], dirs[m[1]])
		}
	}
}
