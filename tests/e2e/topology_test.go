package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// topologyRank is a PMI-1 rank in bash on its PMI_FD: it asks for
// PMI_hwloc_xmlfile (as MPICH 4.2 and later do) and checks that the file
// is hwloc's topology XML.
const topologyRank = `#!/bin/bash
fd=$PMI_FD
printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$fd; read -r -u $fd line
printf 'cmd=get_my_kvsname\n' >&$fd; read -r -u $fd line; kvs=${line##*kvsname=}
printf 'cmd=get kvsname=%s key=PMI_hwloc_xmlfile\n' "$kvs" >&$fd; read -r -u $fd line
path=${line##*value=}
grep -q '<topology' "$path" || { echo "rank $PMI_RANK: $line: no topology XML" >&2; exit 1; }
echo "rank $PMI_RANK topology $path"
printf 'cmd=finalize\n' >&$fd; read -r -u $fd line
`

// Every rank of a node gets one topology file made once for the node
// (hwloc's lstopo), which is gone when the job is.
func TestTopologyFile(t *testing.T) {
	if _, err := exec.LookPath("lstopo"); err != nil {
		t.Fatalf("lstopo not installed (hwloc-nox): %v; %s", err, installHint)
	}
	dir := t.TempDir()
	rank := filepath.Join(dir, "topology-rank")
	if err := os.WriteFile(rank, []byte(topologyRank), 0o755); err != nil {
		t.Fatal(err)
	}
	const size = 4
	r := run(t, job{args: []string{"-n", n(size), rank}})
	r.wantCode(t, 0)
	re := regexp.MustCompile(`(?m)^rank (\d+) topology (\S+)$`)
	m := re.FindAllStringSubmatch(r.stdout, -1)
	if len(m) != size {
		t.Fatalf("%d ranks reported a topology file, want %d:\n%s", len(m), size, r)
	}
	for _, x := range m[1:] {
		if x[2] != m[0][2] {
			t.Errorf("rank %s got %s, rank %s got %s: want one file per node", m[0][1], m[0][2], x[1], x[2])
		}
	}
	if _, err := os.Stat(filepath.Dir(m[0][2])); !os.IsNotExist(err) {
		t.Errorf("the topology file's directory %s outlives the job (%v)", filepath.Dir(m[0][2]), err)
	}
}
