package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// The line names the command, the module version, the revision (12 hex
// digits), its time and a modified tree.
func TestFormat(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fastpmi/fastpmi", Version: "v0.1.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-11-23T22:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	want := "pmid fastpmi v0.1.0 (rev 0123456789ab, 2026-11-23T22:00:00Z, modified) " + runtime.Version()
	if got := format("pmid", bi); !strings.HasPrefix(got, want) {
		t.Errorf("format = %q, want prefix %q", got, want)
	}
	if got := format("pmirun", nil); !strings.HasPrefix(got, "pmirun fastpmi (devel) (rev unknown) ") {
		t.Errorf("no build info: %q", got)
	}
}

// A test binary has build information: its module's.
func TestStringReadsBuildInfo(t *testing.T) {
	if got := String("pmibench"); !strings.HasPrefix(got, "pmibench fastpmi ") || !strings.Contains(got, runtime.GOARCH) {
		t.Errorf("String = %q", got)
	}
}
