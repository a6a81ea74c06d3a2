// Package client is what a rank imports to talk to its node agent during
// start-up: who am I, put / fence / get, allgather, ring exchange,
// non-blocking fence and allgather, names, abort and finalize.
//
// Transports. Under pmirun the client maps the node's shared-memory
// segment (the fd in FASTPMI_SHM_FD) and exchanges with the agent through
// lock-free rings: an Allgather result is read in place from the
// rank-indexed array in shared memory, with no copy. Under a launcher that
// offers only PMI_FD (or PMI_PORT) — Hydra, Slurm, or pmirun with shared
// memory off — the client speaks the PMI-2 text protocol, so the same
// program runs anywhere; fastpmi's own agent also answers the extensions
// (allgather, put hints, waiting gets) there, and elsewhere they fall back
// to plain PMI-2 (put, fence, get). With no launcher at all the client is
// a singleton: rank 0 of 1.
//
// Concurrency. A Client is safe for concurrent use; operations are
// serialised. Several non-blocking requests (Ifence, Iallgather) may be
// outstanding at once; Request.Wait and Request.Test progress all of them.
//
// Lifetimes. Init returns a client bound to the process's PMI connection
// (a second Init under a launcher fails with ErrInitialized); Finalize
// ends it (further calls fail with ErrFinalized, but a collective started
// before it may still be waited for and read). A Values from
// Allgather is a view into shared memory that stays valid until this rank
// starts its second collective (fence or allgather) after the one that
// produced it: fences and allgathers share one epoch sequence and results
// are double-buffered by epoch; copy what must live longer. An allgather
// still unread when a later one takes its result slot (three or more
// outstanding) is copied out first: its Values, read once, is that copy.
//
// The client never imports the agent or the network transport: a rank pays
// only for what it uses.
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// Hint says how a put travels (pmiwire.Hint, the one hint type of
// fastpmi's client, agent and wire).
type Hint = pmiwire.Hint

const (
	// HintNone: PMI semantics, visible after the next fence.
	HintNone = pmiwire.HintNone
	// Dense: for keys most ranks read; they travel with the fence.
	Dense = pmiwire.HintDense
	// Sparse: for keys few ranks read; they are visible at once, without
	// a fence: to the node's ranks from their node, to other nodes'
	// ranks fetched on demand by the job's get strategy (pmirun
	// --get-strategy; docs/kvs.md). A Get with WaitForPut waits for a
	// sparse key not yet put, wherever it will be put.
	Sparse = pmiwire.HintSparse
)

// Errors. Operations return an *Error wrapping one of these or a transport
// error.
var (
	ErrNotFound     = errors.New("key not found")
	ErrFinalized    = errors.New("client finalized")
	ErrNotSupported = errors.New("not supported by this launcher")
	ErrTooLarge     = errors.New("value too large")
	// ErrInitialized: the launcher's connection (PMI_FD, PMI_PORT or the
	// shared segment) was taken by an earlier Init of this process; it
	// serves one client.
	ErrInitialized = errors.New("PMI already initialized in this process")
)

// launcherFile returns a duplicate of the descriptor that the launcher
// variable name=val names, so that trying it takes nothing from the
// program when it is not what the variable says: a variable inherited
// by a process a rank started may name a descriptor the program opened
// itself (Init closed it, stdout say, and the program's own error went
// nowhere). taken closes the launcher's descriptor once the client has
// what it needs from the duplicate.
func launcherFile(name, val string) (f *os.File, taken func(), err error) {
	fd, err := strconv.Atoi(val)
	if err != nil || fd < 0 {
		return nil, nil, untouched{fmt.Errorf("read %s=%q: not a descriptor", name, val)}
	}
	f, err = sys.DupFile(fd, name)
	if err != nil {
		return nil, nil, untouched{fmt.Errorf("%s=%d: %w", name, fd, err)}
	}
	return f, func() { os.NewFile(uintptr(fd), name).Close() }, nil
}

// tooLarge is the error of a value of n bytes over limit.
func tooLarge(n, limit int) error {
	return fmt.Errorf("%d bytes (limit %d): %w", n, limit, ErrTooLarge)
}

// untouched is an Init failure that left the launcher's descriptors and
// variables as they were (the descriptor a variable names was refused,
// or PMI_PORT could not be reached): the launcher's connection is not
// taken, and a later Init tries it again rather than fail with
// ErrInitialized.
type untouched struct{ error }

func (u untouched) Unwrap() error { return u.error }

// refused is the shared-memory transport's refusal of the segment or of
// the rank's place in it, made before it sent the agent anything: the
// launcher's text protocol may still serve the rank.
type refused struct{ error }

func (r refused) Unwrap() error { return r.error }

// launcherTaken is set by the first Init that takes the launcher's
// connection: the descriptors its environment names are that client's
// from then on (closed with it), and another Init must not touch them.
var launcherTaken atomic.Bool

// Error is an operation's failure.
type Error struct {
	Op   string // "fence", "get", "allgather", ...
	Rank int
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("client: rank %d: %s: %v", e.Rank, e.Op, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Info describes this rank and its job.
type Info struct {
	Rank, Size int
	// LocalRank and LocalSize place the rank among its node's ranks:
	// MPI_LOCALRANKID and MPI_LOCALNRANKS, or, under a launcher that
	// sets neither (Slurm), the job's PMI_process_mapping, as MPICH
	// reads it.
	LocalRank, LocalSize int
	Appnum               int
	JobID                string
	// Spawned reports that this rank's job was started by another job's
	// Spawn.
	Spawned bool
	// Transport is "shm", "pmi2" or "singleton".
	Transport string
	// Extensions reports whether the agent answers fastpmi's extensions
	// natively (always true on shm).
	Extensions bool
}

// RingResult is a rank's result of a ring exchange.
type RingResult struct {
	Rank, Size  int    // position in the ring, ring size
	Left, Right []byte // values of the ring neighbours
}

// transport is one way to reach the agent. Methods are called with
// Client.mu held. Collectives are identified by an id the transport
// chooses (the epoch on shared memory, the request number on text).
type transport interface {
	put(key string, val []byte, hint Hint) error
	// startFence and startAllgather start a collective; detached says
	// the caller goes on working (Ifence, Iallgather) rather than waiting
	// for it at once, which the agent's deadlock check must know.
	startFence(detached bool) (uint32, error)
	startAllgather(val []byte, detached bool) (uint32, error)
	// block tells the agent this rank now waits for collective id, one
	// it started detached, or (id 0, which no collective has) that it
	// waits for nothing any more (a wait cut short by its context).
	block(id uint32) error
	// done reports whether collective id has completed, and its error.
	done(id uint32) (bool, error)
	// progress waits (bounded by ctx) until collective id may have
	// completed; poll checks without waiting.
	progress(ctx context.Context, id uint32) error
	poll() error
	values(id uint32) Values
	get(ctx context.Context, key string, o getOpts) ([]byte, error)
	ring(ctx context.Context, val []byte) (RingResult, error)
	jobAttr(ctx context.Context, key string) (string, bool, error)
	putNodeAttr(ctx context.Context, key, val string) error
	nodeAttr(ctx context.Context, key string, wait bool) (string, bool, error)
	publish(ctx context.Context, name, port string) error
	unpublish(ctx context.Context, name string) error
	lookup(ctx context.Context, name string) (string, error)
	spawn(ctx context.Context, req *pmiwire.Spawn) (jobID string, err error)
	abort(code int, msg string) error
	finalize(ctx context.Context) error
	maxValue() int
	// maxPut is the longest key and value a put (and a node
	// attribute's value) may carry where this transport stores them.
	maxPut() (key, val int)
}

// Client is one rank's connection to its node agent.
type Client struct {
	info Info

	mu        sync.Mutex // serialises operations and the transport
	t         transport
	finalized bool
}

// Init connects to the node agent named by the environment: shared memory
// (FASTPMI_SHM_FD) if present, else PMI-2 on PMI_FD or PMI_PORT, else a
// singleton. A segment that is refused (corrupt, foreign, or not saying
// which rank this is: PMI_RANK and MPI_LOCALRANKID) falls back to PMI-2,
// said on stderr, as libfastpmi does. FASTPMI_TRANSPORT=shm makes Init
// fail instead; FASTPMI_TRANSPORT=pmi2 ignores the segment.
func Init() (*Client, error) {
	env := os.Getenv
	info := Info{Size: 1, LocalSize: 1, JobID: "singleton"}
	var err error
	geti := func(k string, def int) int {
		s := env(k)
		if s == "" || err != nil {
			return def
		}
		v, e := strconv.Atoi(s)
		if e != nil {
			err = fmt.Errorf("read %s=%q: %w", k, s, e)
			return def
		}
		return v
	}
	info.Rank = geti("PMI_RANK", 0)
	info.Size = geti("PMI_SIZE", 1)
	info.LocalRank = geti("MPI_LOCALRANKID", info.Rank)
	info.LocalSize = geti("MPI_LOCALNRANKS", info.Size)
	info.Appnum = geti("FASTPMI_APPNUM", 0)
	info.Spawned = env("PMI_SPAWNED") == "1"
	if j := env("PMI_JOBID"); j != "" {
		info.JobID = j
	}
	if err != nil {
		return nil, &Error{Op: "init", Rank: info.Rank, Err: err}
	}
	c := &Client{info: info}
	launched := env("FASTPMI_SHM_FD") != "" || env("PMI_FD") != "" || env("PMI_PORT") != ""
	if launched && launcherTaken.Swap(true) {
		return nil, &Error{Op: "init", Rank: info.Rank, Err: ErrInitialized}
	}
	// FASTPMI_TRANSPORT, as libfastpmi reads it: shm refuses to start
	// without the segment, pmi2 ignores it.
	want, shmFD, text := env("FASTPMI_TRANSPORT"), env("FASTPMI_SHM_FD"), env("PMI_FD") != "" || env("PMI_PORT") != ""
	if want == "pmi2" {
		shmFD = ""
	}
	switch {
	case want != "" && want != "shm" && want != "pmi2":
		err = untouched{fmt.Errorf("FASTPMI_TRANSPORT=%s: want shm or pmi2", want)}
	case shmFD != "":
		c.t, err = newShmTransport(&c.info, shmFD, env("PMI_RANK") != "" && env("MPI_LOCALRANKID") != "")
		var r refused
		switch {
		case !errors.As(err, &r):
		case want == "shm":
			err = fmt.Errorf("FASTPMI_TRANSPORT=shm but the segment was refused: %w", r.error)
		case text:
			// As libfastpmi: the launcher's text protocol still serves
			// the rank (and says which rank it is), and the user learns
			// why it is the slower path.
			if c.t, err = newTextTransport(&c.info); err != nil {
				err = fmt.Errorf("%w (shared memory was refused: %v)", err, r.error)
			} else {
				fmt.Fprintf(os.Stderr, "fastpmi client: rank %d: shared memory refused (%v); using the PMI-2 text protocol\n", c.info.Rank, r.error)
			}
		}
	case want == "shm":
		err = untouched{errors.New("FASTPMI_TRANSPORT=shm but the launcher gave no segment (FASTPMI_SHM_FD)")}
	case text:
		c.t, err = newTextTransport(&c.info)
	default:
		c.info = Info{Size: 1, LocalSize: 1, JobID: "singleton", Transport: "singleton", Extensions: true}
		c.t = newSingleton()
	}
	if err != nil {
		if errors.As(err, new(untouched)) {
			launcherTaken.Store(false) // another Init may try them
		}
		return nil, &Error{Op: "init", Rank: info.Rank, Err: err}
	}
	return c, nil
}

// Info returns this rank's identity and job layout.
func (c *Client) Info() Info { return c.info }

// Rank returns this rank's number in the job.
func (c *Client) Rank() int { return c.info.Rank }

// Size returns the number of ranks in the job.
func (c *Client) Size() int { return c.info.Size }

func (c *Client) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: op, Rank: c.info.Rank, Err: err}
}

func (c *Client) begin(op string) error {
	if c.finalized {
		return &Error{Op: op, Rank: c.info.Rank, Err: ErrFinalized}
	}
	return nil
}

// Put stores key=value for other ranks. With HintNone or Dense it is
// visible to every rank after the next fence; with Sparse it is visible
// without a fence, at once to the ranks of this node and to other nodes'
// ranks when their Get fetches it (see Sparse).
//
// Keys take 1 to 64 bytes and values up to 1024 (pmiwire.KeyLenMax,
// pmiwire.ValLenMax; a longer value fails with ErrTooLarge), neither
// holding a NUL byte (Allgather and Ring carry any bytes). Under a
// PMI-2 server other than fastpmi's (Hydra, Slurm) the limits are one
// byte less, what MPICH's and Slurm's PMI2_MAX_KEYLEN and PMI2_MAX_VALLEN
// hold with the terminating NUL, and under one that is not Slurm's either
// (Hydra) a value may not hold a ';': such a server would cut the value
// or lose the key and still report the put done.
func (c *Client) Put(key string, value []byte, hint Hint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("put"); err != nil {
		return err
	}
	kmax, vmax := c.t.maxPut()
	if key == "" || len(key) > kmax {
		return &Error{Op: "put", Rank: c.info.Rank, Err: fmt.Errorf("key %q: want 1 to %d bytes", key, kmax)}
	}
	if strings.IndexByte(key, 0) >= 0 || bytes.IndexByte(value, 0) >= 0 {
		// PMI carries no NUL byte in a key or value (Allgather and Ring
		// do: they encode what they must).
		return &Error{Op: "put", Rank: c.info.Rank, Err: fmt.Errorf("key %q: a NUL byte in the key or value", key)}
	}
	if len(value) > vmax {
		return &Error{Op: "put", Rank: c.info.Rank, Err: fmt.Errorf("key %q: %w", key, tooLarge(len(value), vmax))}
	}
	return c.fail("put", c.t.put(key, value, hint))
}

// Fence waits until every rank has entered the fence; afterwards every
// put made before it is visible to Get. A ctx already ended when Fence
// is called keeps the rank out of the fence; if ctx ends while Fence
// waits, the rank has entered the fence all the same: the fence
// completes once the others enter it, and the rank's next fence or
// allgather is the collective after it, not this one again (to wait
// again after a timeout, use Ifence and Wait).
func (c *Client) Fence(ctx context.Context) error {
	return c.ifence(ctx, false).Wait(ctx)
}

// Ifence starts a fence and returns at once; Wait completes it. Several
// fences and allgathers may be outstanding; every rank must start its
// collectives in the same order. Until Wait, the agent knows this rank
// may still put keys, and does not count it as stuck.
func (c *Client) Ifence() Request { return c.ifence(context.Background(), true) }

// ifence starts a fence unless ctx has already ended (a call that is
// not made takes no effect: the rank does not enter the fence).
func (c *Client) ifence(ctx context.Context, detached bool) Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Request{c: c, op: "fence", detached: detached}
	if r.err = c.begin("fence"); r.err != nil {
		return r
	}
	if err := ctx.Err(); err != nil {
		r.err = &Error{Op: "fence", Rank: c.info.Rank, Err: err}
		return r
	}
	r.id, r.err = c.t.startFence(detached)
	r.err = c.fail("fence", r.err)
	return r
}

// GetOption modifies Get.
type GetOption func(*getOpts)

type getOpts struct {
	src  int  // rank that put the key, -1 unknown
	wait bool // wait for a late put instead of failing
}

// FromRank tells Get which rank put the key, so the agent can fetch it
// straight from that rank's node. An r that is no rank of the job
// (negative, or not below Size) says nothing (unknown).
func FromRank(r int) GetOption { return func(o *getOpts) { o.src = max(r, -1) } }

// WaitForPut makes Get wait (bounded by its context) for a key that has
// not been put yet, instead of failing with ErrNotFound. fastpmi's agent
// parks such a get until the put; a PMI-2 server without the extension
// (Hydra, Slurm) is asked again, at most every 32 ms once the wait is
// long.
func WaitForPut() GetOption { return func(o *getOpts) { o.wait = true } }

// Get returns the value of key. It fails with ErrNotFound if the key is
// not visible, unless WaitForPut is given. Under Hydra a Get before this
// rank's first Fence (or collective) fails without asking: Hydra's PMI-2
// server would end the whole job on it.
func (c *Client) Get(ctx context.Context, key string, opts ...GetOption) ([]byte, error) {
	o := getOpts{src: -1}
	for _, f := range opts {
		f(&o)
	}
	if o.src >= c.info.Size {
		o.src = -1 // the agent takes only a rank of the job
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("get"); err != nil {
		return nil, err
	}
	v, err := c.t.get(ctx, key, o)
	if err != nil && o.wait && ctx.Err() != nil {
		return nil, c.cutShort("get "+key, ctx.Err())
	}
	return v, c.fail("get "+key, err)
}

// Allgather contributes value and returns every rank's value, indexed by
// rank. On shared memory the result is read in place (see Values). As
// with Fence, a ctx already ended keeps the rank out of the allgather,
// and one that ends while Allgather waits leaves the value contributed
// all the same (to wait again after a timeout, use Iallgather and Wait).
func (c *Client) Allgather(ctx context.Context, value []byte) (Values, error) {
	r := c.iallgather(ctx, value, false)
	if err := r.Wait(ctx); err != nil {
		return Values{}, err
	}
	return r.Values(), nil
}

// Iallgather starts an allgather and returns at once; Wait completes it
// and Values returns the result. As with Ifence, the agent does not
// count this rank as stuck until Wait. One exception: over shared memory
// the collectives in flight take turns in two input slots, so an
// Iallgather started while the collective two before it (this rank's
// fence or allgather before the last) is still outstanding waits until
// that one completes, telling the agent it waits; it takes no context.
func (c *Client) Iallgather(value []byte) Request {
	return c.iallgather(context.Background(), value, true)
}

// iallgather starts an allgather unless ctx has already ended, as ifence.
func (c *Client) iallgather(ctx context.Context, value []byte, detached bool) Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Request{c: c, op: "allgather", detached: detached}
	if r.err = c.begin("allgather"); r.err != nil {
		return r
	}
	if err := ctx.Err(); err != nil {
		r.err = &Error{Op: "allgather", Rank: c.info.Rank, Err: err}
		return r
	}
	if len(value) > c.t.maxValue() {
		r.err = &Error{Op: "allgather", Rank: c.info.Rank, Err: tooLarge(len(value), c.t.maxValue())}
		return r
	}
	r.id, r.err = c.t.startAllgather(value, detached)
	r.err = c.fail("allgather", r.err)
	return r
}

// Ring exchanges value with the ring neighbours: it returns this rank's
// ring position and size and the values of the ranks before and after it.
// If ctx ends while Ring waits, the rank has entered the ring all the
// same: its neighbours get its value, its own result is lost, and a Ring
// before that ring has completed fails ("entered ring 1 twice").
func (c *Client) Ring(ctx context.Context, value []byte) (RingResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("ring"); err != nil {
		return RingResult{}, err
	}
	if len(value) > c.t.maxValue() {
		return RingResult{}, &Error{Op: "ring", Rank: c.info.Rank, Err: tooLarge(len(value), c.t.maxValue())}
	}
	res, err := c.t.ring(ctx, value)
	return res, c.fail("ring", err)
}

// JobAttr returns a job attribute (PMI_process_mapping, universeSize, ...).
func (c *Client) JobAttr(ctx context.Context, key string) (string, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("job attribute"); err != nil {
		return "", false, err
	}
	v, ok, err := c.t.jobAttr(ctx, key)
	return v, ok, c.fail("job attribute "+key, err)
}

// PutNodeAttr sets a node attribute: a value the ranks of this node, and
// only they, read with NodeAttr (PMI-2's info-putnodeattr; MPICH shares
// its node's shared-memory handles this way). A second put replaces the
// value. The value's limits are Put's.
func (c *Client) PutNodeAttr(ctx context.Context, key, value string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("node attribute"); err != nil {
		return err
	}
	if _, vmax := c.t.maxPut(); len(value) > vmax {
		return &Error{Op: "node attribute " + key, Rank: c.info.Rank, Err: tooLarge(len(value), vmax)}
	}
	return c.fail("node attribute "+key, c.t.putNodeAttr(ctx, key, value))
}

// NodeAttr reads a node attribute. Without wait, found is false when no
// rank of this node has put it; with wait it waits (bounded by ctx) until
// one does, and fails if that can never happen (every rank of the node
// waits).
func (c *Client) NodeAttr(ctx context.Context, key string, wait bool) (value string, found bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("node attribute"); err != nil {
		return "", false, err
	}
	v, ok, err := c.t.nodeAttr(ctx, key, wait)
	if err != nil && wait && ctx.Err() != nil {
		return "", false, c.cutShort("node attribute "+key, ctx.Err())
	}
	return v, ok, c.fail("node attribute "+key, err)
}

// Publish publishes name → port for other jobs' and ranks' Lookup.
// Neither may be empty.
func (c *Client) Publish(ctx context.Context, name, port string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("publish"); err != nil {
		return err
	}
	if name == "" || port == "" {
		return &Error{Op: "publish " + name, Rank: c.info.Rank, Err: fmt.Errorf("name %q, port %q: want both", name, port)}
	}
	return c.fail("publish "+name, c.t.publish(ctx, name, port))
}

// Unpublish withdraws name. It fails with ErrNotFound if name is not
// published.
func (c *Client) Unpublish(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("unpublish"); err != nil {
		return err
	}
	return c.fail("unpublish "+name, c.t.unpublish(ctx, name))
}

// Lookup returns the port published under name. It fails with
// ErrNotFound if no job of the run has published it.
func (c *Client) Lookup(ctx context.Context, name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("lookup"); err != nil {
		return "", err
	}
	p, err := c.t.lookup(ctx, name)
	return p, c.fail("lookup "+name, err)
}

// Abort asks the launcher to end the whole job with code. The caller
// should exit afterwards. Only the first 1024 bytes of msg are sent
// (pmiwire.ValLenMax, as libfastpmi sends): a longer message neither fits
// a shared-memory request nor a PMI-2 message the agent reads.
func (c *Client) Abort(code int, msg string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin("abort"); err != nil {
		return err
	}
	return c.fail("abort", c.t.abort(code, msg[:min(len(msg), pmiwire.ValLenMax)]))
}

// Finalize ends this rank's use of PMI. It is idempotent. A collective
// still outstanding (an Ifence or Iallgather not waited for) may be
// waited for after it, and its Values read; over the PMI-2 text protocol
// Finalize first waits for such collectives to complete, since their
// answers come on the connection it closes.
func (c *Client) Finalize() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finalized {
		return nil
	}
	c.finalized = true
	return c.fail("finalize", c.t.finalize(context.Background()))
}

// Request is a non-blocking collective in progress. It is a small value
// (starting one allocates nothing); copies refer to the same collective.
type Request struct {
	c        *Client
	op       string
	id       uint32
	detached bool  // started by Ifence or Iallgather: Wait tells the agent it waits
	err      error // failure to start
}

// ErrNoRequest is returned by the methods of a zero Request.
var ErrNoRequest = errors.New("zero Request")

// Wait blocks until the request completes or ctx ends, progressing every
// outstanding request meanwhile. A Wait that ctx ended leaves the request
// outstanding: it may be waited for again.
func (r Request) Wait(ctx context.Context) error {
	if r.c == nil {
		return ErrNoRequest
	}
	if r.err != nil {
		return r.err
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	told := false // the agent knows this rank waits for r
	for {
		done, err := c.t.done(r.id)
		if done {
			return c.fail(r.op, err)
		}
		if err := ctx.Err(); err != nil {
			return c.cutShort(r.op, err)
		}
		if r.detached && !told && !c.finalized {
			if err := c.t.block(r.id); err != nil {
				return c.fail(r.op, err)
			}
			told = true
		}
		if err := c.t.progress(ctx, r.id); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return c.cutShort(r.op, cerr)
			}
			return c.fail(r.op, err)
		}
	}
}

// cutShort ends a Wait, or a waiting Get or NodeAttr, that its context
// ended before the agent answered: the rank goes back to work, so the
// agent must stop counting it as waiting (it may yet put what another
// rank waits for) and forget the request it left parked.
func (c *Client) cutShort(op string, err error) error {
	if c.finalized {
		// The agent takes nothing more from a finalized rank.
		return &Error{Op: op, Rank: c.info.Rank, Err: err}
	}
	if berr := c.t.block(0); berr != nil {
		return c.fail(op, berr)
	}
	return &Error{Op: op, Rank: c.info.Rank, Err: err}
}

// Test reports whether the request has completed, without blocking,
// progressing every outstanding request meanwhile. While another
// goroutine's call holds the client (calls are serialised: a Wait, a
// Fence, a waiting Get) Test does not wait for it to end and reports
// false, not yet known to be done.
func (r Request) Test() bool {
	if r.c == nil {
		return false
	}
	if r.err != nil {
		return true
	}
	c := r.c
	if !c.mu.TryLock() {
		return false
	}
	defer c.mu.Unlock()
	_ = c.t.poll()
	done, _ := c.t.done(r.id)
	return done
}

// Values returns an allgather's result once Wait succeeded; a fence's
// is empty.
func (r Request) Values() Values {
	if r.c == nil || r.err != nil || r.op != "allgather" {
		return Values{}
	}
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.t.values(r.id)
}
