package importrules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/fastpmi/fastpmi"

// linkRule forbids the packages in banned (or below them) anywhere in the
// transitive dependencies of each root.
type linkRule struct {
	name   string
	roots  []string // import paths
	banned []string // import paths; a path also bans the packages below it
	why    string
}

var linkRules = []linkRule{
	{
		name:   "pmid-pmirun-without-client",
		roots:  []string{module + "/cmd/pmid", module + "/cmd/pmirun"},
		banned: []string{module + "/client"},
		why:    "the launcher and the agent serve PMI; the client is what ranks link",
	},
	{
		name:   "pmid-pmirun-without-plots",
		roots:  []string{module + "/cmd/pmid", module + "/cmd/pmirun"},
		banned: []string{module + "/internal/benchplot", "gonum.org/v1/plot"},
		why:    "figures are pmibench's; the launcher and the agent do not link the plotting library",
	},
	{
		name:  "client-without-agent",
		roots: []string{module + "/client"},
		banned: []string{
			module + "/agent",
			module + "/netio",
			module + "/launch",
			"github.com/pawelgaczynski/giouring",
		},
		why: "ranks link the client; the agent and the network transport stay out of their binaries",
	},
}

// fileRule allows the imports in paths (or below them) only in the files
// allowed accepts; every other file of the module importing one breaks it.
type fileRule struct {
	name    string
	paths   []string
	where   string // who may import paths, for the failure message
	allowed func(pkg, file string) bool
}

func inPkg(pkgs ...string) func(pkg, file string) bool {
	return func(pkg, _ string) bool { return slices.Contains(pkgs, pkg) }
}

var fileRules = []fileRule{
	{
		name:    "kernel-door",
		paths:   []string{"syscall", "golang.org/x/sys/unix"},
		where:   "only internal/sys may (add a small function there and call it)",
		allowed: inPkg(module + "/internal/sys"),
	},
	{
		name:    "unsafe",
		paths:   []string{"unsafe"},
		where:   "only shm and internal/sys may",
		allowed: inPkg(module+"/shm", module+"/internal/sys"),
	},
	{
		name:    "cgo",
		paths:   []string{"C"},
		where:   "only agent/pmix (OpenPMIx's server library, behind the pmix build tag) and clib/cfuzz (tests) may",
		allowed: inPkg(module+"/agent/pmix", module+"/clib/cfuzz"),
	},
	{
		name:  "giouring",
		paths: []string{"github.com/pawelgaczynski/giouring"},
		where: "only netio's _linux.go files may",
		allowed: func(pkg, file string) bool {
			return pkg == module+"/netio" && strings.HasSuffix(file, "_linux.go")
		},
	},
	{
		name:    "mmap-go",
		paths:   []string{"github.com/edsrzf/mmap-go"},
		where:   "only shm may",
		allowed: inPkg(module + "/shm"),
	},
}

// TestImportRules checks every rule, each in its own subtest.
func TestImportRules(t *testing.T) {
	gobin := goCommand(t)
	root := moduleRoot(t, gobin)
	pkgs := goList(t, gobin, root, "./...")
	if len(pkgs) < 10 || pkgs[module+"/internal/sys"] == nil {
		t.Fatalf("go list ./... gave an implausible package list (%d packages)", len(pkgs))
	}

	var roots []string
	for _, r := range linkRules {
		roots = append(roots, r.roots...)
	}
	deps := goList(t, gobin, root, append([]string{"-deps"}, roots...)...)
	for _, r := range linkRules {
		t.Run(r.name, func(t *testing.T) {
			for _, from := range r.roots {
				for _, v := range linkViolations(deps, from, r.banned) {
					t.Errorf("%s links %s (%s):\n\t%s\n\t%s",
						short(from), v.banned, r.why, strings.Join(shortAll(v.chain), " -> "), v.where(root))
				}
			}
		})
	}

	files := moduleImports(t, root, pkgs)
	if !slices.ContainsFunc(files, func(f fileImport) bool {
		return f.pkg == module+"/internal/sys" && f.path == "golang.org/x/sys/unix"
	}) {
		t.Fatalf("parsed %d imports but none of golang.org/x/sys/unix in internal/sys: the file walk is broken", len(files))
	}
	for _, r := range fileRules {
		t.Run(r.name, func(t *testing.T) {
			for _, f := range files {
				if !matches(f.path, r.paths) || r.allowed(f.pkg, filepath.Base(f.pos.Filename)) {
					continue
				}
				t.Errorf("%s: package %s imports %q; %s", rel(root, f.pos), short(f.pkg), f.path, r.where)
			}
		})
	}

	t.Run("package-docs", func(t *testing.T) {
		for _, path := range sortedKeys(pkgs) {
			if msg := docProblem(root, pkgs[path]); msg != "" {
				t.Error(msg)
			}
		}
	})
}

// TestLinkViolations checks the dependency walk of the link rules on a
// made-up import graph: it must name the shortest chain and nothing when
// the banned package is not reachable.
func TestLinkViolations(t *testing.T) {
	graph := map[string]*listPackage{
		"cmd":    {ImportPath: "cmd", Imports: []string{"cli", "fmt"}},
		"cli":    {ImportPath: "cli", Imports: []string{"launch"}},
		"launch": {ImportPath: "launch", Imports: []string{"agent", "client"}},
		"agent":  {ImportPath: "agent", Imports: []string{"shm", "client/sub"}},
		"client": {ImportPath: "client", Imports: []string{"shm"}},
		"shm":    {ImportPath: "shm"},
		"fmt":    {ImportPath: "fmt"},
	}
	graph["client/sub"] = &listPackage{ImportPath: "client/sub"}
	got := linkViolations(graph, "cmd", []string{"client"})
	want := [][]string{
		{"cmd", "cli", "launch", "client"},
		{"cmd", "cli", "launch", "agent", "client/sub"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d violations %v, want %v", len(got), got, want)
	}
	for i := range want {
		if !slices.Equal(got[i].chain, want[i]) {
			t.Errorf("violation %d: chain %v, want %v", i, got[i].chain, want[i])
		}
	}
	if v := linkViolations(graph, "agent", []string{"launch", "cmd"}); len(v) != 0 {
		t.Errorf("agent does not reach launch or cmd, got %v", v)
	}
	if v := linkViolations(graph, "shm", []string{"client"}); len(v) != 0 {
		t.Errorf("shm does not reach client, got %v", v)
	}
}

// TestLinkRuleOnRealPackages runs the link check on real packages whose
// answer is known: the agent and netio do not link the client (the check
// must pass), pmid does link the agent (the check must find it, with the
// file that imports it).
func TestLinkRuleOnRealPackages(t *testing.T) {
	gobin := goCommand(t)
	root := moduleRoot(t, gobin)
	deps := goList(t, gobin, root, "-deps", module+"/agent", module+"/netio", module+"/cmd/pmid")
	for _, from := range []string{module + "/agent", module + "/netio"} {
		if v := linkViolations(deps, from, []string{module + "/client"}); len(v) != 0 {
			t.Errorf("%s does not link the client, but the check says: %v", short(from), v[0].chain)
		}
	}
	v := linkViolations(deps, module+"/cmd/pmid", []string{module + "/agent"})
	if len(v) == 0 {
		t.Fatal("pmid links the agent, but the check finds nothing")
	}
	if !strings.Contains(v[0].where(root), ".go:") {
		t.Errorf("violation does not name the importing file: %q", v[0].where(root))
	}
}

// listPackage is the part of go list -json's output the rules read.
type listPackage struct {
	ImportPath     string
	Name           string
	Dir            string
	Doc            string
	DepOnly        bool
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
	TestGoFiles    []string
	XTestGoFiles   []string
	Imports        []string
	Error          *struct{ Err string }
}

// goCommand returns the go command. go test puts its own GOROOT/bin first
// in the test's PATH, so this is the go that runs the test.
func goCommand(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not in PATH: %v", err)
	}
	return gobin
}

func moduleRoot(t *testing.T, gobin string) string {
	t.Helper()
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		t.Fatalf("go env GOMOD: %q is not a module", gomod)
	}
	return filepath.Dir(gomod)
}

// goList runs go list -e -json args in dir and returns the packages by
// import path; a package go list could not load fails the test.
func goList(t *testing.T, gobin, dir string, args ...string) map[string]*listPackage {
	t.Helper()
	cmd := exec.Command(gobin, append([]string{"list", "-e", "-json"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	pkgs := make(map[string]*listPackage)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(listPackage)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list %s: %v", strings.Join(args, " "), err)
		}
		if p.Error != nil {
			t.Errorf("go list: package %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// linkViolation is one banned package in a root's dependencies.
type linkViolation struct {
	banned string
	chain  []string // root ... importer, banned: the shortest import chain
	file   string   // the importer's file that imports banned, if found
	line   int
}

func (v linkViolation) where(root string) string {
	importer := v.chain[len(v.chain)-2]
	if v.file == "" {
		return fmt.Sprintf("package %s imports %s", short(importer), v.banned)
	}
	return fmt.Sprintf("%s imports %s", rel(root, token.Position{Filename: v.file, Line: v.line}), v.banned)
}

// linkViolations walks from's dependencies breadth first over the graph
// go list -deps printed and returns, for each banned package it reaches, the
// shortest import chain to it and the importer's file that imports it,
// in the order the walk met them.
func linkViolations(graph map[string]*listPackage, from string, banned []string) []linkViolation {
	parent := map[string]string{from: ""}
	queue := []string{from}
	var out []linkViolation
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != from && matches(p, banned) {
			var chain []string
			for q := p; q != ""; q = parent[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			v := linkViolation{banned: p, chain: chain}
			v.file, v.line = importingFile(graph[chain[len(chain)-2]], p)
			out = append(out, v)
			continue // what a banned package imports is its own business
		}
		pkg := graph[p]
		if pkg == nil {
			continue
		}
		for _, imp := range pkg.Imports {
			if _, seen := parent[imp]; !seen {
				parent[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return out
}

// importingFile returns the file (and line) of pkg's build that imports
// path, or "" when pkg has no files on disk to read.
func importingFile(pkg *listPackage, path string) (string, int) {
	if pkg == nil || pkg.Dir == "" {
		return "", 0
	}
	fset := token.NewFileSet()
	for _, name := range slices.Concat(pkg.GoFiles, pkg.CgoFiles) {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.ImportsOnly)
		if err != nil {
			continue
		}
		for _, spec := range f.Imports {
			if p, err := strconv.Unquote(spec.Path.Value); err == nil && p == path {
				return fset.Position(spec.Pos()).Filename, fset.Position(spec.Pos()).Line
			}
		}
	}
	return "", 0
}

// fileImport is one import of one file of the module.
type fileImport struct {
	pkg  string // the import path of the file's directory
	path string // what it imports
	pos  token.Position
}

// moduleImports parses the imports of every Go file of the module's
// packages: the files of this build, those other build constraints select
// (IgnoredGoFiles), and test files.
func moduleImports(t *testing.T, root string, pkgs map[string]*listPackage) []fileImport {
	t.Helper()
	var out []fileImport
	fset := token.NewFileSet()
	for _, path := range sortedKeys(pkgs) {
		p := pkgs[path]
		names := slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles, p.TestGoFiles, p.XTestGoFiles)
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			if !strings.HasSuffix(name, ".go") {
				continue
			}
			file := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			if err != nil {
				t.Errorf("parse imports of %s: %v", rel(root, token.Position{Filename: file}), err)
				continue
			}
			for _, spec := range f.Imports {
				imp, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					t.Errorf("%s: bad import path %s", rel(root, fset.Position(spec.Pos())), spec.Path.Value)
					continue
				}
				out = append(out, fileImport{pkg: path, path: imp, pos: fset.Position(spec.Pos())})
			}
		}
	}
	return out
}

// docProblem says what is wrong with p's package doc comment, or "" when
// it is there and starts as it should: "Package name ..." or, for a
// program, "Command dir ...".
func docProblem(root string, p *listPackage) string {
	want := "Package " + p.Name + " "
	if p.Name == "main" {
		want = "Command " + filepath.Base(p.Dir) + " "
	}
	if p.Doc == "" {
		files := strings.Join(p.GoFiles, ", ")
		if files == "" {
			files = "none: add a doc.go"
		}
		return fmt.Sprintf("package %s (%s) has no package doc comment; write one starting %q above the package clause of one file (non-test files: %s)",
			short(p.ImportPath), rel(root, token.Position{Filename: p.Dir}), want+"...", files)
	}
	if strings.HasPrefix(p.Doc, want) {
		return ""
	}
	carrier := rel(root, token.Position{Filename: p.Dir})
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err == nil && f.Doc != nil {
			carrier = rel(root, fset.Position(f.Doc.Pos()))
			break
		}
	}
	return fmt.Sprintf("%s: package doc comment of %s starts %q, want %q", carrier, short(p.ImportPath), p.Doc, want+"...")
}

// matches reports whether path is one of paths or below one of them.
func matches(path string, paths []string) bool {
	for _, p := range paths {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// short drops the module path from an import path of the module.
func short(path string) string {
	if s, ok := strings.CutPrefix(path, module+"/"); ok {
		return s
	}
	return path
}

func shortAll(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = short(p)
	}
	return out
}

// rel writes a position with its file relative to the module root when
// it lies inside it.
func rel(root string, pos token.Position) string {
	if r, err := filepath.Rel(root, pos.Filename); err == nil && !strings.HasPrefix(r, "..") {
		pos.Filename = r
	}
	return pos.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
