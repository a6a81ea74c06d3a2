//go:build pmix

package pmix

/*
#cgo pkg-config: pmix
#cgo CFLAGS: -Wall -Wextra -std=gnu11
#cgo LDFLAGS: -Wl,--as-needed
#include <stdlib.h>
#include "server.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/guard"
)

// Supported reports whether this build serves PMIx ranks.
const Supported = true

// server is the process's PMIx server; guarded by registry.mu. It is
// started by the first Job and lives until the process exits (Shutdown):
// OpenPMIx 4.2 cannot start a server again in a process once it
// finalized one.
var server struct {
	started, shut bool
	tmpdir        string // PMIx's rendezvous and shared-store directory, removed by Shutdown
	// stuck says why the library stopped answering (a deregistration
	// passed its bound), once it did: it never answers again, and a job
	// registered with it waited for ever in the registration (its node
	// "lost" after --net-timeout, in a daemon every later PMIx job, each
	// leaving a goroutine stuck for good), so later Jobs are refused.
	stuck error
}

// libraryVar names OpenPMIx's server library for pmirun and pmid to open
// (a path, or a file name the dynamic loader finds), for one installed
// elsewhere than where the build found it; without it they open
// defaultLibrary, found on the run path the build recorded or by the
// loader's usual search.
const (
	libraryVar     = "FASTPMI_PMIX_LIBRARY"
	defaultLibrary = "libpmix.so.2"
)

// load opens OpenPMIx's library, unless an earlier call did. Under
// registry.mu.
func load() error {
	lib := os.Getenv(libraryVar)
	if lib == "" {
		lib = defaultLibrary
	}
	clib := C.CString(lib)
	defer C.fpx_free(clib)
	if why := C.fpx_load(clib); why != nil {
		return fmt.Errorf("pmix: open OpenPMIx's library %s (install it, name it with %s, or run the job with --mpi pmi): %s",
			lib, libraryVar, C.GoString(why))
	}
	return nil
}

// serverAcquire starts the server for the first Job. Under registry.mu.
func serverAcquire() error {
	if server.shut {
		return errors.New("pmix: the server of this process was shut down")
	}
	if server.stuck != nil {
		return server.stuck
	}
	if !server.started {
		if err := load(); err != nil {
			return err
		}
		// Named by the process, so whoever knows the pid finds it.
		dir, err := os.MkdirTemp("", "fastpmi-pmix-"+strconv.Itoa(os.Getpid())+"-")
		if err != nil {
			return fmt.Errorf("pmix: server directory: %w", err)
		}
		cdir := C.CString(dir)
		rc := C.fpx_init(cdir)
		C.fpx_free(cdir)
		if rc != C.PMIX_SUCCESS {
			os.RemoveAll(dir)
			return fmt.Errorf("pmix: PMIx_server_init: %w", statusErr(rc))
		}
		server.started, server.tmpdir = true, dir
		guard.AddDir(dir) // removed by the guard if this process is killed
	}
	registry.refs++
	return nil
}

// serverRelease is a Job's end. Under registry.mu.
func serverRelease() { registry.refs-- }

// Shutdown ends the process's PMIx server, if one was started, and
// removes its directory; later Jobs fail. pmirun and pmid call it as they
// exit, once their jobs have closed.
//
// It does not call PMIx_server_finalize. The process is ending, and the
// finalize only tears down what the exit takes anyway (the library's
// threads and sockets, and its files, all in the directory removed
// here); after a job whose rank was killed in a fence it has crashed (a
// NULL dereference on the library's progress thread, twice in the e2e
// suite) and once hung, turning a job's verdict into a Go crash report
// or a pmirun that does not exit.
func Shutdown() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if server.shut {
		return
	}
	server.shut = true
	if !server.started {
		return
	}
	os.RemoveAll(server.tmpdir)
	guard.RemoveDir(server.tmpdir)
}

// teardownTimeout bounds each wait for the server library as a job or the
// process ends.
const teardownTimeout = 10 * time.Second

// statusErr is a PMIx status as an error.
func statusErr(rc C.int) error {
	return fmt.Errorf("%s (%d)", C.GoString(C.fpx_error(rc)), int(rc))
}

// registerNspace registers cfg's job with the server.
func registerNspace(cfg *Config) error {
	l := agent.Layout{Size: cfg.Size, Hosts: cfg.Hosts, Nodes: cfg.Nodes}
	appnum := cfg.Appnum
	if appnum == nil {
		appnum = make([]int, cfg.Size)
	}
	return register(cfg.Nspace, &l, cfg.Usize, cfg.Index, appnum, cfg.Parent)
}

// registerForeign registers nspace, another job of the run with no rank
// on this node, as l lays it out: without local clients, its universe
// size, app numbers and parent unknown here (Job.foreignLayout).
func registerForeign(nspace string, l *agent.Layout) error {
	return register(nspace, l, 0, -1, nil, nil)
}

// register registers namespace nspace laid out as l, as node index of it
// (-1: no rank of it here), with appnum by rank (nil: not known).
func register(nspace string, l *agent.Layout, usize, index int, appnum []int, parent *Proc) error {
	size := l.Size
	var ppn []string
	nodeOf := C.fpx_ints(C.int(size))
	lrank := C.fpx_ints(C.int(size))
	defer C.fpx_free_ints(nodeOf)
	defer C.fpx_free_ints(lrank)
	cs := func(s string) *C.char { return C.CString(s) }
	j := C.fpx_job{
		nspace: cs(nspace), size: C.int(size), usize: C.int(usize), nnodes: C.int(len(l.Nodes)), node: C.int(index),
		nodeof: nodeOf, lrank: lrank,
	}
	if appnum != nil {
		// App ranks: ranks of each app numbered from 0 in rank order.
		j.appnum, j.apprank = C.fpx_ints(C.int(size)), C.fpx_ints(C.int(size))
		defer C.fpx_free_ints(j.appnum)
		defer C.fpx_free_ints(j.apprank)
		appFirst := map[int]int{}
		for r, a := range appnum {
			if _, ok := appFirst[a]; !ok {
				appFirst[a] = r
			}
			C.fpx_ints_set(j.appnum, C.int(r), C.int(a))
			C.fpx_ints_set(j.apprank, C.int(r), C.int(r-appFirst[a]))
		}
	}
	j.hostnames = C.fpx_strs(C.int(len(l.Nodes)))
	defer C.fpx_strs_free(j.hostnames, C.int(len(l.Nodes)))
	for i, ranks := range l.Nodes {
		C.fpx_strs_set(j.hostnames, C.int(i), C.CString(l.Hosts[i]))
		rs := make([]string, len(ranks))
		for lr, r := range ranks {
			rs[lr] = strconv.Itoa(r)
			C.fpx_ints_set(nodeOf, C.int(r), C.int(i))
			C.fpx_ints_set(lrank, C.int(r), C.int(lr))
		}
		ppn = append(ppn, strings.Join(rs, ","))
	}
	j.nodelist, j.ppn = cs(strings.Join(l.Hosts, ",")), cs(strings.Join(ppn, ";"))
	if index >= 0 {
		local := l.Nodes[index]
		j.nlocal, j.leader, j.peers = C.int(len(local)), C.int(local[0]), cs(ppn[index])
	}
	if parent != nil {
		j.parent, j.parent_rank = cs(parent.Nspace), C.int(parent.Rank)
	}
	defer func() {
		for _, p := range []*C.char{j.nspace, j.nodelist, j.ppn, j.peers, j.parent} {
			C.fpx_free(p)
		}
	}()
	if rc := C.fpx_register_nspace(&j); rc != C.PMIX_SUCCESS {
		return statusErr(rc)
	}
	return nil
}

// deregisterNspace deregisters nspace, waiting for the library at most
// teardownTimeout.
func deregisterNspace(nspace string) error {
	c := C.CString(nspace)
	defer C.fpx_free(c)
	rc := C.fpx_deregister_nspace(c, C.int(teardownTimeout/time.Second))
	switch rc {
	case C.PMIX_SUCCESS:
		return nil
	case C.PMIX_ERR_TIMEOUT:
		registry.mu.Lock()
		if server.stuck == nil {
			server.stuck = fmt.Errorf("pmix: OpenPMIx's server library in this process stopped answering (namespace %s's deregistration took more than %v; OpenPMIx 4.2 does after a PMIx_Connect with PMIX_TIMEOUT that a local client never joined): it serves no more PMIx jobs; restart this pmid (or run PMIx jobs with agents of their own)",
				nspace, teardownTimeout)
		}
		registry.mu.Unlock()
	}
	return fmt.Errorf("pmix: deregister namespace %s: %w", nspace, statusErr(rc))
}

// clientEnv registers global rank r of nspace and returns the
// environment PMIx_server_setup_fork gives it.
func clientEnv(nspace string, r int) ([]string, error) {
	c := C.CString(nspace)
	defer C.fpx_free(c)
	var env **C.char
	if rc := C.fpx_register_client(c, C.int(r), C.int(os.Getuid()), C.int(os.Getgid()), &env); rc != C.PMIX_SUCCESS {
		return nil, statusErr(rc)
	}
	defer C.fpx_free_env(env)
	var out []string
	for i := 0; ; i++ {
		s := C.fpx_env_at(env, C.int(i))
		if s == nil {
			return out, nil
		}
		out = append(out, C.GoString(s))
	}
}

// status is the PMIx status that completes a request with err.
func status(err error) C.int {
	switch {
	case err == nil:
		return C.PMIX_SUCCESS
	case errors.Is(err, errNotFound):
		return C.PMIX_ERR_NOT_FOUND
	case errors.Is(err, errTimeout):
		return C.PMIX_ERR_TIMEOUT
	}
	return C.PMIX_ERROR
}

// rankDataRequest asks the server library for the data local rank
// committed (rank -1: the namespace's job data); fpxRankData gets the
// answer, with id.
func rankDataRequest(nspace string, rank int, id uint64) error {
	c := C.CString(nspace)
	defer C.fpx_free(c)
	if rc := C.fpx_rank_data(c, C.int(rank), C.ulonglong(id)); rc != C.PMIX_SUCCESS {
		return fmt.Errorf("pmix: PMIx_server_dmodex_request: %w", statusErr(rc))
	}
	return nil
}

//export fpxRankData
func fpxRankData(nspace *C.char, id C.ulonglong, rank C.int, st C.int, data *C.char, n C.int) {
	j := lookupJob(C.GoString(nspace))
	if j == nil {
		return
	}
	r := &request{kind: reqRankData, id: uint64(id), rank: int(rank)}
	switch st {
	case C.PMIX_SUCCESS:
		r.found = true
		if n > 0 {
			r.data = []byte(C.GoStringN(data, n)) // every byte, NULs too
		}
	case C.PMIX_ERR_NOT_FOUND:
	default:
		r.err = fmt.Errorf("pmix: rank %d's data: %w", int(rank), statusErr(st))
	}
	j.enqueueInternal(r)
}

//export fpxRequest
func fpxRequest(kind C.int, nspace *C.char, rank C.uint, code C.int, msg *C.char, strs **C.char, n C.int, cb *C.fpx_cb) C.int {
	ns := C.GoString(nspace)
	r := &request{rank: int(rank)}
	j := lookupJob(ns)
	switch {
	case kind == C.FPX_DMODEX && j == nil:
		// A rank, or the job data, of a job with no rank here: another
		// job of the run (Open MPI reads the business cards of the job
		// it spawned), fetched from the launcher through a job of the
		// same run.
		j, r.job = nearestJob(ns), ns
		if rank == C.PMIX_RANK_WILDCARD {
			r.rank = -1
		}
	case kind == C.FPX_DMODEX && rank == C.PMIX_RANK_WILDCARD:
		return C.PMIX_ERR_NOT_SUPPORTED // job data: the namespace is registered here
	}
	if j == nil {
		return C.PMIX_ERR_NOT_FOUND
	}
	switch kind {
	case C.FPX_CONNECTED:
		r.kind = reqConnected
	case C.FPX_FINALIZED:
		r.kind = reqFinalized
	case C.FPX_ABORT:
		r.kind, r.code = reqAbort, int(code)
		if msg != nil {
			r.msg = C.GoString(msg)
		}
	case C.FPX_FENCE:
		r.kind, r.rank = reqFence, -1
		if n > 0 {
			r.data = []byte(C.GoStringN(msg, n))
		}
		if code > 0 {
			r.timeout = time.Duration(code) * time.Second
		}
	case C.FPX_DMODEX:
		r.kind = reqDmodex
		if code > 0 {
			r.timeout = time.Duration(code) * time.Second
		}
	case C.FPX_PUBLISH, C.FPX_LOOKUP, C.FPX_UNPUBLISH:
		r.kind = map[C.int]reqKind{C.FPX_PUBLISH: reqPublish, C.FPX_LOOKUP: reqLookup, C.FPX_UNPUBLISH: reqUnpublish}[kind]
		r.strs = goStrings(strs, n)
		switch {
		case kind == C.FPX_PUBLISH:
			r.once = code == 1
		case kind == C.FPX_LOOKUP && code == 0:
			r.timeout = agent.MaxNameWait // PMIX_WAIT without a timeout
		case kind == C.FPX_LOOKUP && code > 0:
			r.timeout = min(time.Duration(code)*time.Second, agent.MaxNameWait)
		}
	case C.FPX_SPAWN:
		sp, err := parseApps(goStrings(strs, n), int(code))
		if err != nil {
			j.cfg.Logger.Warn("pmix: refused spawn", "rank", int(rank), "err", err)
			return C.PMIX_ERR_BAD_PARAM
		}
		r.kind, r.spawn = reqSpawn, sp
	default:
		return C.PMIX_ERR_NOT_SUPPORTED
	}
	switch r.kind {
	case reqFence, reqDmodex:
		r.done = func(res result) { modexDone(cb, res) }
	case reqSpawn:
		r.done = func(res result) {
			cns := C.CString(res.nspace)
			defer C.fpx_free(cns)
			C.fpx_spawn_done(cb, status(res.err), cns)
		}
	case reqLookup:
		r.done = func(res result) {
			kv := C.fpx_strs(C.int(len(res.found)))
			defer C.fpx_strs_free(kv, C.int(len(res.found)))
			for i, s := range res.found {
				C.fpx_strs_set(kv, C.int(i), C.CString(s))
			}
			cns := C.CString(ns)
			defer C.fpx_free(cns)
			C.fpx_lookup_done(cb, status(res.err), cns, kv, C.int(len(res.found)))
		}
	default:
		r.done = func(res result) { C.fpx_op_done(cb, status(res.err)) }
	}
	return enqueueStatus(j, r)
}

//export fpxJobsRequest
func fpxJobsRequest(kind C.int, nss **C.char, ranks *C.uint, n C.int, timeout C.int, data *C.char, ndata C.int, cb *C.fpx_cb) C.int {
	r := &request{kind: reqJobs, rank: -1}
	if timeout > 0 {
		r.timeout = time.Duration(timeout) * time.Second
	}
	switch kind {
	case C.FPX_JOBS_FENCE:
		r.jobs.Kind = agent.JobsFence
	case C.FPX_CONNECT:
		r.jobs.Kind = agent.JobsConnect
	case C.FPX_DISCONNECT:
		r.jobs.Kind = agent.JobsDisconnect
	default:
		return C.PMIX_ERR_NOT_SUPPORTED
	}
	// The participants, job by job; a wildcard names every rank. The
	// Job of the first namespace served here carries the request.
	var j *Job
	byJob := map[string]int{}
	for i, ns := range goStrings(nss, n) {
		k, ok := byJob[ns]
		if !ok {
			k = len(r.jobs.Procs)
			byJob[ns] = k
			r.jobs.Procs = append(r.jobs.Procs, agent.JobRanks{Job: ns, Ranks: []int{}})
			if j == nil {
				j = lookupJob(ns)
			}
		}
		p := &r.jobs.Procs[k]
		switch rank := C.fpx_uint_at(ranks, C.int(i)); {
		case rank == C.PMIX_RANK_WILDCARD:
			p.Ranks = nil
		case p.Ranks != nil:
			p.Ranks = append(p.Ranks, int(rank))
		}
	}
	if j == nil {
		return C.PMIX_ERR_NOT_FOUND
	}
	if ndata > 0 {
		r.data = []byte(C.GoStringN(data, ndata))
	}
	r.done = func(res result) {
		if kind != C.FPX_JOBS_FENCE {
			C.fpx_op_done(cb, status(res.err))
			return
		}
		modexDone(cb, res)
	}
	return enqueueStatus(j, r)
}

// enqueueStatus hands r to j's worker and returns what the host callback
// returns to the server library: 0 (the request is Go's, completed
// later) or why it was refused.
func enqueueStatus(j *Job, r *request) C.int {
	switch err := j.enqueue(r); {
	case errors.Is(err, errQueueFull):
		return C.PMIX_ERR_OUT_OF_RESOURCE
	case err != nil:
		return C.PMIX_ERR_NOT_FOUND
	}
	return 0
}

// modexDone completes cb, a fence's or a direct modex's, with res.
func modexDone(cb *C.fpx_cb, res result) {
	var p *C.char
	if len(res.data) > 0 {
		p = C.CString(string(res.data)) // copies every byte, NULs too
		defer C.fpx_free(p)
	}
	C.fpx_modex_done(cb, status(res.err), p, C.int(len(res.data)))
}

// goStrings copies C's n strings.
func goStrings(strs **C.char, n C.int) []string {
	out := make([]string, 0, int(n))
	for i := 0; i < int(n); i++ {
		out = append(out, C.GoString(C.fpx_str_at(strs, C.int(i))))
	}
	return out
}

//export fpxWholeJob
func fpxWholeJob(nspace *C.char, ranks *C.uint, n C.int) C.int {
	j := lookupJob(C.GoString(nspace))
	if j == nil {
		return 0
	}
	rs := make([]int, int(n))
	for i := range rs {
		rs[i] = int(C.fpx_uint_at(ranks, C.int(i)))
	}
	if j.wholeJob(rs) {
		return 1
	}
	return 0
}

//export fpxNotifyEvent
func fpxNotifyEvent(nspace *C.char, rank C.uint, code, rng C.int) C.int {
	j := lookupJob(C.GoString(nspace))
	switch {
	case j == nil:
		return C.PMIX_ERR_NOT_FOUND
	case len(j.cfg.Nodes) == 1:
		return C.PMIX_OPERATION_SUCCEEDED // every rank of the job is a client here
	}
	if j.eventSaid.CompareAndSwap(false, true) { // once a job: a rank may notify in a loop
		j.cfg.Logger.Warn("pmix: a rank's event reaches only the ranks of its own node: fastpmi carries no PMIx events between nodes",
			"rank", int(rank), "code", int(code), "range", int(rng))
	}
	return C.PMIX_ERR_NOT_SUPPORTED
}

// The host callbacks' side of the Jobs (job.go).

// lookupJob returns the Job serving nspace, or nil.
func lookupJob(nspace string) *Job {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.jobs[nspace]
}

// nearestJob returns the Job whose namespace shares the longest prefix
// with nspace, or nil if none is served here: the jobs of one run share
// the command line's job id, which the ids of the jobs it spawns extend
// ("<id>-<n>", launch's childSpec), and ids of different runs differ
// after their first characters (a process id and a random part).
func nearestJob(nspace string) *Job {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	var best *Job
	bestLen := -1
	for ns, j := range registry.jobs {
		n := 0
		for n < len(ns) && n < len(nspace) && ns[n] == nspace[n] {
			n++
		}
		if n > bestLen || (n == bestLen && ns < best.cfg.Nspace) {
			best, bestLen = j, n
		}
	}
	return best
}

// wholeJob reports whether ranks name every rank of the job once.
func (j *Job) wholeJob(ranks []int) bool {
	if len(ranks) != j.cfg.Size {
		return false
	}
	seen := make([]bool, j.cfg.Size)
	for _, r := range ranks {
		if r < 0 || r >= j.cfg.Size || seen[r] {
			return false
		}
		seen[r] = true
	}
	return true
}
