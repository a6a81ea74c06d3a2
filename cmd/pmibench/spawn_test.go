package main

import (
	"io"
	"testing"
)

// -spawn refuses a -timeout no run could meet, before any run: with
// '-timeout 0s' it ran every job, each ending at once with 'context
// deadline exceeded' (exit 1). Each bad value is refused under its own
// flag's name, as in the other modes (it said "-count 0, -rounds 2").
func TestSpawnFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-timeout", "0s"}, "parse -timeout: 0s is not positive"},
		{[]string{"-count", "0"}, "parse -count: 0 is below 1"},
		{[]string{"-rounds", "0"}, "parse -rounds: 0 is below 1"},
		{[]string{"-nodes", "1"}, "parse -nodes: 1 is below 2"},
		{[]string{"-rate-time", "-1s"}, "parse -rate-time: -1s is negative"},
	} {
		if _, err := parseSpawnFlags(c.args, io.Discard); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
}
