package pmix

import (
	"reflect"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// parseApps reads the apps of a PMIx spawn as server.c flattens them:
// per app cmd, maxprocs, cwd and three counted lists (argv after argv[0],
// env, info key/value pairs); the info keys fastpmi serves become its
// own spawn info keys, PMIX_WDIR winning over the app's cwd, and the
// others are dropped. Anything that does not add up is refused.
func TestParseApps(t *testing.T) {
	sp, err := parseApps([]string{
		"/bin/a", "2", "/home", "2", "x", "y", "0", "6", "pmix.host", "n1,n2", "pmix.mapby", "core", "pmix.wdir", "/tmp",
		"b", "1", "", "0", "1", "K=V", "2", "pmix.hostfile", "hf",
	}, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := &pmiwire.Spawn{Cmds: []pmiwire.SpawnCmd{
		{Exe: "/bin/a", MaxProcs: 2, Args: []string{"x", "y"}, Env: []string{},
			Info: []pmiwire.Pair{{Key: "hosts", Val: "n1,n2"}, {Key: "wdir", Val: "/tmp"}}},
		{Exe: "b", MaxProcs: 1, Args: []string{}, Env: []string{"K=V"}, Info: []pmiwire.Pair{{Key: "hostfile", Val: "hf"}}},
	}}
	if !reflect.DeepEqual(sp, want) {
		t.Errorf("parsed %+v\nwant %+v", sp, want)
	}
	for _, bad := range [][]string{
		{},
		{"a"},
		{"", "1", "", "0", "0", "0"},              // no command
		{"a", "0", "", "0", "0", "0"},             // no process
		{"a", "x", "", "0", "0", "0"},             // maxprocs not a number
		{"a", "1", "", "-1", "0", "0"},            // negative count
		{"a", "1", "", "3", "x", "0", "0"},        // argv shorter than its count
		{"a", "1", "", "0", "0", "1", "k"},        // odd info list
		{"a", "1", "", "0", "0", "0", "extra"},    // strings after the last app
		{"a", "1", "", "0", "0", "99999999", "k"}, // count beyond the strings
	} {
		if sp, err := parseApps(bad, 1); err == nil {
			t.Errorf("parseApps(%q) = %+v, want an error", bad, sp)
		}
	}
}
