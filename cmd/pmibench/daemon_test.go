package main

import (
	"slices"
	"testing"
)

// -daemon times the same job both ways, on at most as many agents or
// daemons as there are ranks.
func TestDaemonLaunchers(t *testing.T) {
	d := &daemons{secret: "/s", addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}
	ls := d.launchers("/bin/pmirun")
	w := Workload{Name: "pmi2", Prog: "/p"}
	for _, tc := range []struct {
		l    int
		n    int
		want []string
	}{
		{0, 1, []string{"/bin/pmirun", "--bootstrap", "loopback", "--nodes", "1", "-n", "1", "/p"}},
		{0, 8, []string{"/bin/pmirun", "--bootstrap", "loopback", "--nodes", "2", "-n", "8", "/p"}},
		{1, 1, []string{"/bin/pmirun", "--secret-file", "/s", "--daemons", "127.0.0.1:1", "-n", "1", "/p"}},
		{1, 64, []string{"/bin/pmirun", "--secret-file", "/s", "--daemons", "127.0.0.1:1,127.0.0.1:2", "-n", "64", "/p"}},
	} {
		if got := ls[tc.l].Argv(tc.n, w); !slices.Equal(got, tc.want) {
			t.Errorf("%s N=%d: %q, want %q", ls[tc.l].Name, tc.n, got, tc.want)
		}
	}
	if ls[0].Name != "loopback" || ls[1].Name != "daemon" {
		t.Errorf("launchers %s, %s: want loopback then daemon (the ratio is loopback/daemon)", ls[0].Name, ls[1].Name)
	}
}
