// Package jobreport defines the document pmirun writes at the end of a
// job when given --report FILE, and the one way to read it back. pmirun
// (package launch) fills a Report; pmibench, and any tool that wants a
// job's phases, counters or benchmark figures, reads it with ReadFile
// instead of parsing log lines.
//
// Model. A Report is plain data, built once when the job is over and
// never changed after; it holds no references into the launcher. Times
// are offsets in nanoseconds from the job's start (pmirun's perf
// recorder's t0; the Started wall-clock time says when that was), so
// they compare within one report. Counters are the maps the nodes keep
// in their perf.Recorder, unchanged: names are the recorder's ("net.frames.sent",
// "tree.msgs.sent", "bcast.bytes.in", ...), values their totals over the
// whole job.
//
// Versions. Version is bumped when a field changes meaning or goes away;
// new fields may appear without a bump. ReadFile refuses documents of a
// newer version than it knows (ErrVersion).
//
// Scale figures. Global rank 0 of a --virtual job (the scale
// benchmark's goroutine ranks, package internal/virtual) reduces its
// timings to a Scale and books its numeric fields as counters on its
// node's recorder, under ScaleCounterPrefix (Scale.Counters); they reach
// pmirun with the node's other counters, and pmirun lifts them out of the
// node's counters into Report.Scale (SplitScale). The JSON field names of
// Scale are the counter names, so the two cannot drift apart.
package jobreport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/perf"
)

// Version is the version of the document this package writes.
const Version = 1

// ErrVersion is returned by ReadFile for a document without a version or
// of a newer version than this package knows.
var ErrVersion = errors.New("unsupported report version")

// Report is one job as pmirun saw it. Fields the job never reached (a job
// refused before it started has no nodes or phases) are left empty.
type Report struct {
	Version   int    `json:"version"`   // Version
	JobID     string `json:"job_id"`    // the job's id (PMI kvsname)
	Size      int    `json:"size"`      // ranks (-n)
	Bootstrap string `json:"bootstrap"` // fork, loopback, netns, ssh, slurm
	// NetBackend is the transport of pmirun's links to the agents ("net",
	// "uring"); empty for the fork bootstrap, which has none.
	NetBackend string `json:"netio,omitempty"`
	Virtual    string `json:"virtual,omitempty"` // the --virtual workload, if any

	Started  time.Time     `json:"started"`           // wall-clock time of the job's start
	Wall     time.Duration `json:"wall_ns"`           // from the start until the report was made
	ExitCode int           `json:"exit_code"`         // pmirun's exit code
	Failure  string        `json:"failure,omitempty"` // why the job failed; empty when it succeeded

	// Phases are the perf marks pmirun's recorder holds, one entry per
	// phase name, in the order of their first occurrence. For the fork
	// bootstrap that is every mark of the node (ranks forked, first PMI
	// command, PMI init, fence enter and done, finalize, rank exit); for
	// the other bootstraps the marks the root makes itself (agents
	// started and connected, fence done) and those of the agents' events
	// (PMI init, finalize, rank exit), stamped when pmirun received them:
	// the agents' own clocks are not comparable with pmirun's.
	Phases []Phase `json:"phases"`
	// Nodes are the job's nodes by index: one for the fork bootstrap, one
	// per agent otherwise.
	Nodes []Node `json:"nodes"`
	// RootCounters are pmirun's own counters as the root of the agent
	// tree ("bcast.bytes.raw" and "bcast.bytes.sent": the broadcasts it
	// gathered, before and after compression); empty for fork.
	RootCounters map[string]int64 `json:"root_counters,omitempty"`
	// Scale holds global rank 0's figures of a --virtual job; nil
	// otherwise, or when rank 0 did not get as far as reporting.
	Scale *Scale `json:"scale,omitempty"`
}

// Phase is one named perf mark over the whole job: how many ranks (or
// the launcher, as rank -1) were stamped with it, and when the first and
// the last were.
type Phase struct {
	Name  string        `json:"name"`
	Count int           `json:"count"`
	First time.Duration `json:"first_ns"`
	Last  time.Duration `json:"last_ns"`
}

// Node is one node of the job.
type Node struct {
	Index int    `json:"index"`
	Host  string `json:"host,omitempty"` // where its agent ran, as the bootstrap named it
	Ranks int    `json:"ranks"`          // ranks placed on it
	// Counters are the node's perf counters at the end of the job (for
	// the fork bootstrap, pmirun's own recorder's); nil when the node's
	// agent never reported them (it was lost, or never started).
	Counters map[string]int64 `json:"counters"`
}

// Phases reduces evs (a perf.Recorder's Events, sorted by time) to one
// Phase per mark name, in the order of each name's first mark. Spans are
// left out.
func Phases(evs []perf.Event) []Phase {
	var out []Phase
	idx := map[string]int{}
	for _, e := range evs {
		if e.Kind != perf.KindMark {
			continue
		}
		i, ok := idx[e.Name]
		if !ok {
			i = len(out)
			idx[e.Name] = i
			out = append(out, Phase{Name: e.Name, First: e.At, Last: e.At})
		}
		p := &out[i]
		p.Count++
		p.First, p.Last = min(p.First, e.At), max(p.Last, e.At)
	}
	return out
}

// Phase returns the phase named name and whether the report has it.
func (r *Report) Phase(name string) (Phase, bool) {
	i := slices.IndexFunc(r.Phases, func(p Phase) bool { return p.Name == name })
	if i < 0 {
		return Phase{}, false
	}
	return r.Phases[i], true
}

// Marshal encodes r as indented JSON with a final newline.
func (r *Report) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	return append(b, '\n'), nil
}

// Unmarshal decodes a report and checks its version.
func Unmarshal(b []byte) (*Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode report: %w", err)
	}
	if r.Version < 1 || r.Version > Version {
		return nil, fmt.Errorf("decode report: version %d: %w (want 1..%d)", r.Version, ErrVersion, Version)
	}
	return &r, nil
}

// CheckWritable says, before a job runs, why a file could not be
// written at path when it ends (a report, a trace, a benchmark's
// results): path is a directory, or its directory is missing or not
// writable, or path is a device or link (written in place, see WriteOut)
// that cannot be opened for writing. It leaves nothing behind. A pipe is
// not opened: that would wait for its reader.
func CheckWritable(path string) error {
	if inPlace(path) {
		st, err := os.Stat(path)
		switch {
		case err != nil && errors.Is(err, fs.ErrNotExist):
			// A dangling link: its target is made when written.
		case err != nil:
			return fmt.Errorf("cannot write %s: %w", path, pathCause(err))
		case st.IsDir():
			return fmt.Errorf("%s is a directory", path)
		case st.Mode()&fs.ModeNamedPipe != 0:
		default:
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return fmt.Errorf("cannot write %s: %w", path, pathCause(err))
			}
			f.Close()
		}
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", filepath.Dir(path), pathCause(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// inPlace reports whether path is written in place by WriteOut: it is
// there and is no regular file (a device such as /dev/null, a pipe, a
// link such as /dev/stdout or one to a file elsewhere), which a renamed
// file would replace rather than write to.
func inPlace(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && !st.Mode().IsRegular()
}

// pathCause is err without the name of the temporary file it was about.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// WriteOut writes to path what write writes: to a temporary file in the
// same directory first, renamed into place, so that a reader never sees
// half of it; a write that fails (a full disk) leaves no file at path,
// neither a truncated one nor an older one that could pass for this.
// A path that is there and no regular file is written in place,
// truncated as a shell's > would: a device (/dev/null), a pipe, a link
// (/dev/stdout, a link to a file elsewhere), which the rename would
// otherwise replace (for root, /dev/null itself). The error names the
// cause, not the temporary file.
func WriteOut(path string, write func(w io.Writer) error) error {
	if inPlace(path) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return pathCause(err)
		}
		err = write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return pathCause(err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return pathCause(err)
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		if st, serr := os.Lstat(path); serr == nil && st.Mode().IsRegular() {
			os.Remove(path) // an older file, never what path became since
		}
		return pathCause(err)
	}
	return nil
}

// WriteFile writes r to path (WriteOut).
func (r *Report) WriteFile(path string) error {
	b, err := r.Marshal()
	if err != nil {
		return err
	}
	if err := WriteOut(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}); err != nil {
		return fmt.Errorf("write report %s: %w", path, err)
	}
	return nil
}

// ReadFile reads the report at path.
func ReadFile(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	return Unmarshal(b)
}

// Scale is global rank 0's report of a --virtual job (the scale
// benchmark). Median, Min, Max and Mean are its own timed rounds, from
// before its operation to after it completed and its result was checked;
// Warmup is the untimed rounds together. The span and tail figures are
// per round over every rank, from CLOCK_MONOTONIC stamps that compare only
// because every agent runs on one machine: span is the last completion
// minus the first entry, tail the last completion minus the last entry
// (tail ≤ span). When ForeignClocks ranks' clocks were on another machine
// than rank 0's, span, tail and the late figures are left zero.
//
// A late-arrival job (--virtual-late) sets Late, rank 0's wait after each
// round's barrier; LateLast, the timed rounds rank 0 entered after every
// other rank; and LateGapMin, the least time by which it did (negative
// when some rank entered after it).
//
// The JSON names are also the counter names (after ScaleCounterPrefix)
// under which rank 0's node books the numeric fields; Op is not a number
// and is filled in from the job's --virtual by whoever reads them.
type Scale struct {
	Op     string `json:"op"`
	P      int    `json:"p"`      // ranks in the job
	Local  int    `json:"local"`  // ranks on rank 0's node
	Rounds int    `json:"rounds"` // timed rounds

	Median time.Duration `json:"median_ns"`
	Min    time.Duration `json:"min_ns"`
	Max    time.Duration `json:"max_ns"`
	Mean   time.Duration `json:"mean_ns"`
	Warmup time.Duration `json:"warmup_ns"`

	ForeignClocks int           `json:"foreign_clocks,omitempty"`
	SpanMedian    time.Duration `json:"span_median_ns,omitempty"`
	SpanMin       time.Duration `json:"span_min_ns,omitempty"`
	TailMedian    time.Duration `json:"tail_median_ns,omitempty"`
	TailMin       time.Duration `json:"tail_min_ns,omitempty"`
	TailMax       time.Duration `json:"tail_max_ns,omitempty"`

	Late       time.Duration `json:"late_ns,omitempty"`
	LateLast   int           `json:"late_last,omitempty"`
	LateGapMin time.Duration `json:"late_gap_min_ns,omitempty"`
}

// ScaleCounterPrefix starts the counter names of rank 0's Scale figures
// on its node ("scale.median_ns").
const ScaleCounterPrefix = "scale."

// Counters returns the numeric fields of s as counters, named
// ScaleCounterPrefix plus their JSON names; zero fields that JSON leaves
// out are left out.
func (s Scale) Counters() map[string]int64 {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("encode scale figures: %v", err)) // plain numbers cannot fail
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		panic(fmt.Sprintf("decode scale figures: %v", err))
	}
	out := make(map[string]int64, len(m))
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			if i, err := n.Int64(); err == nil {
				out[ScaleCounterPrefix+k] = i
			}
		}
	}
	return out
}

// SplitScale separates a node's counters into the Scale figures booked
// under ScaleCounterPrefix, if there are any, and the rest; c is not
// changed. op fills Scale.Op.
func SplitScale(c map[string]int64, op string) (rest map[string]int64, s *Scale, err error) {
	var figures map[string]int64
	for k, v := range c {
		if name, ok := strings.CutPrefix(k, ScaleCounterPrefix); ok {
			if figures == nil {
				figures = map[string]int64{}
			}
			figures[name] = v
			continue
		}
		if rest == nil {
			rest = make(map[string]int64, len(c))
		}
		rest[k] = v
	}
	if c != nil && rest == nil {
		rest = map[string]int64{}
	}
	if figures == nil {
		return rest, nil, nil
	}
	b, err := json.Marshal(figures)
	if err != nil {
		return c, nil, fmt.Errorf("scale figures: %w", err)
	}
	s = &Scale{}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(s); err != nil {
		return c, nil, fmt.Errorf("scale figures: %w", err)
	}
	s.Op = op
	return rest, s, nil
}
