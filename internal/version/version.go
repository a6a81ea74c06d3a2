// Package version says which build of fastpmi is running: the module
// version and the VCS revision Go stamped into the binary
// (debug.ReadBuildInfo), for the --version of pmirun, pmid and pmibench.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// String is the one line --version prints for command name, e.g.
// "pmirun fastpmi v0.1.0 (rev 1a2b3c4d5e6f, 2026-11-23T22:00:00Z, modified) go1.26.8 linux/amd64".
func String(name string) string {
	bi, _ := debug.ReadBuildInfo()
	return format(name, bi)
}

// format is String for the build information bi (nil: none).
func format(name string, bi *debug.BuildInfo) string {
	mod, rev, when, dirty := "(devel)", "unknown", "", false
	if bi != nil {
		if bi.Main.Version != "" {
			mod = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
				if len(rev) > 12 {
					rev = rev[:12]
				}
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	rs := "rev " + rev
	if when != "" {
		rs += ", " + when
	}
	if dirty {
		rs += ", modified"
	}
	return fmt.Sprintf("%s fastpmi %s (%s) %s %s/%s", name, mod, rs, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
