package launch

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// jobOut is what a job leaves for its --report document (Config.ReportPath),
// filled in by Run and runMulti as they get that far: the recorder of the
// fork bootstrap's node, or the root of a multi-node job. Only Run's
// goroutine touches it, and write reads it after every goroutine the job
// started has been waited for.
type jobOut struct {
	start time.Time      // Run was called
	rec   *perf.Recorder // the fork bootstrap's node's recorder, or nil
	root  *rootNode      // a multi-node job's root, or nil
}

// write writes the report of the job that ended with err, if the job has
// a ReportPath. A report that cannot be written is said on stderr and
// does not change the job's exit code (as with --trace).
func (o *jobOut) write(cfg *Config, err error) {
	if cfg.ReportPath == "" {
		return
	}
	rep := o.report(cfg, err)
	if werr := rep.WriteFile(cfg.ReportPath); werr != nil {
		stderr := cfg.Stderr
		if stderr == nil {
			stderr = os.Stderr
		}
		fmt.Fprintf(stderr, "pmirun: %v\n", werr)
	}
}

// report builds the job's document.
func (o *jobOut) report(cfg *Config, err error) *jobreport.Report {
	bootstrap := cfg.Bootstrap
	if bootstrap == "" {
		bootstrap = "fork"
	}
	rep := &jobreport.Report{
		Version: jobreport.Version, JobID: cfg.JobID, Size: cfg.Size, Bootstrap: bootstrap, Virtual: cfg.Virtual,
		Started: o.start, ExitCode: ExitCode(err), Phases: []jobreport.Phase{}, Nodes: []jobreport.Node{},
	}
	if err != nil {
		rep.Failure = err.Error()
	}
	rec := o.rec
	if o.root != nil {
		rec = o.root.rec
	}
	if rec != nil {
		rep.Started = rec.Start()
		// The root's own phases: a traced job's merged node events would
		// count each rank's phases twice, and its spawned jobs' are not
		// its own.
		own := slices.DeleteFunc(rec.Events(), func(e perf.Event) bool { return e.Node != rec.Node() || e.Job != 0 })
		rep.Phases = jobreport.Phases(own)
	}
	rep.Wall = time.Since(rep.Started)
	switch {
	case o.root != nil:
		r := o.root
		rep.NetBackend = r.tr.Backend().Name
		rep.RootCounters = rec.Counters()
		for i, c := range r.counters {
			n := jobreport.Node{Index: i, Host: r.hosts[i], Ranks: len(r.spec.Nodes[i]), Counters: c}
			if cfg.Virtual != "" {
				rest, s, serr := jobreport.SplitScale(c, cfg.Virtual)
				switch {
				case serr != nil:
					cfg.Logger.Warn("node sent bad scale figures", "node", i, "err", serr)
				case s != nil:
					n.Counters, rep.Scale = rest, s
				}
			}
			rep.Nodes = append(rep.Nodes, n)
		}
	case o.rec != nil:
		host, _ := os.Hostname()
		rep.Nodes = append(rep.Nodes, jobreport.Node{Index: 0, Host: host, Ranks: cfg.Size, Counters: o.rec.Counters()})
	}
	return rep
}
