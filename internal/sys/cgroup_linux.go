//go:build linux

package sys

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// MemoryRoom returns the room the memory cgroup leaves this process (v2
// memory.max − memory.current, v1 memory.limit_in_bytes −
// memory.usage_in_bytes); ok is false where no memory cgroup sets a limit
// or none can be read.
func MemoryRoom() (r Room, ok bool) {
	return cgroupRoom("memory", []cgroupFiles{
		{limit: "memory.max", usage: "memory.current"},
		{limit: "memory.limit_in_bytes", usage: "memory.usage_in_bytes"},
	})
}

// TaskRoom returns the room the pids cgroup leaves this process: how many
// more processes and threads it may create (pids.max − pids.current, the
// same files on v1 and v2); ok is false where no pids cgroup sets a limit.
func TaskRoom() (r Room, ok bool) {
	return cgroupRoom("pids", []cgroupFiles{{limit: "pids.max", usage: "pids.current"}})
}

// IsProcessLimit reports whether err is a fork or clone that failed for
// want of room for another task (EAGAIN: RLIMIT_NPROC, a pids cgroup or
// the kernel's own thread limit).
func IsProcessLimit(err error) bool { return errors.Is(err, syscall.EAGAIN) }

// cgroupFiles names a controller's limit and usage files in one cgroup
// version.
type cgroupFiles struct{ limit, usage string }

// v1Unlimited: cgroup v1 writes "no limit" as the largest page-aligned
// int64; anything at or above it is no limit.
const v1Unlimited = 1 << 62

// cgroupRoom walks from this process's cgroup of controller up to its
// hierarchy's mount and returns the least room a limit there leaves.
func cgroupRoom(controller string, files []cgroupFiles) (best Room, ok bool) {
	for _, dir := range cgroupDirs(controller) {
		for d := dir.path; strings.HasPrefix(d, dir.mount); d = filepath.Dir(d) {
			for _, f := range files {
				limit, lerr := readCgroupValue(filepath.Join(d, f.limit))
				if lerr != nil || limit >= v1Unlimited {
					continue
				}
				used, uerr := readCgroupValue(filepath.Join(d, f.usage))
				if uerr != nil {
					continue
				}
				r := Room{Limit: limit, Used: used, File: filepath.Join(d, f.limit)}
				if used < limit {
					r.Left = limit - used
				}
				if !ok || r.Left < best.Left {
					best, ok = r, true
				}
			}
			if d == dir.mount {
				break
			}
		}
	}
	return best, ok
}

// cgroupDir is this process's cgroup directory in one mounted hierarchy.
type cgroupDir struct{ mount, path string }

// cgroupDirs finds this process's cgroup directories that carry
// controller: the v1 hierarchy with it mounted, and the v2 (unified)
// hierarchy, which carries every enabled controller (the walk finds
// whether its files exist).
func cgroupDirs(controller string) []cgroupDir {
	mounts := cgroupMountTable()
	cg, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	defer cg.Close()
	var out []cgroupDir
	sc := bufio.NewScanner(cg)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		key := "cgroup2"
		if f[1] != "" {
			if !hasField(f[1], controller) {
				continue
			}
			key = controller
		}
		m, found := mounts[key]
		if !found {
			continue
		}
		rel, inside := strings.CutPrefix(f[2], m.root)
		if !inside {
			continue // the process's cgroup is not under this mount
		}
		out = append(out, cgroupDir{mount: m.point, path: filepath.Join(m.point, rel)})
	}
	return out
}

// cgroupMount is where a hierarchy is mounted and which of its cgroups is
// the mount's root.
type cgroupMount struct{ point, root string }

// cgroupMountTable is cgroupMounts, read once per process: a launcher
// checks the memory and pids cgroups before its first fork, and the
// kernel writes mountinfo anew at each read (about 50 µs here, a third
// of a MemoryRoom). Hierarchies are mounted as the machine starts; one
// mounted later is not seen by this process.
var cgroupMountTable = sync.OnceValue(cgroupMounts)

// cgroupMounts reads /proc/self/mountinfo: the v1 hierarchies by each
// controller they carry, the v2 hierarchy as "cgroup2". The map is not
// changed once returned.
func cgroupMounts() map[string]cgroupMount {
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer mi.Close()
	out := map[string]cgroupMount{}
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		pre, post, found := strings.Cut(sc.Text(), " - ")
		if !found {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		m := cgroupMount{point: unescapeMount(pf[4]), root: unescapeMount(pf[3])}
		switch qf[0] {
		case "cgroup2":
			if _, dup := out["cgroup2"]; !dup {
				out["cgroup2"] = m
			}
		case "cgroup":
			for _, c := range strings.Split(qf[2], ",") {
				if _, dup := out[c]; !dup {
					out[c] = m
				}
			}
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hasField reports whether the comma-separated list holds name.
func hasField(list, name string) bool {
	for _, f := range strings.Split(list, ",") {
		if f == name {
			return true
		}
	}
	return false
}

// readCgroupValue reads a cgroup file holding one number; "max" (v2's no
// limit) reads as the largest value.
func readCgroupValue(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 1<<64 - 1, nil
	}
	return strconv.ParseUint(s, 10, 64)
}
