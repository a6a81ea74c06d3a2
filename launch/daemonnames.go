package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// nameService is the run's name service: agent.Local in pmirun, or, for a
// run on daemons, daemonNames. Its callbacks may run on any goroutine.
type nameService interface {
	Publish(name, port string, once bool, done func(error))
	Unpublish(name string, done func(error))
	Lookup(name string, wait time.Duration, done func(port string, err error))
	Close()
}

// daemonNames is a name-service session with the daemon of a run's first
// node (agent/daemon's names.go): runs launched separately on the same
// daemons share their names, and their jobs (daemonjobs.go). Requests are
// answered by the session's reader goroutine, or fail after timeout; the
// daemon's own requests (Op set) go to serve, whose answer goes back on
// the session; Close ends the session and waits for the reader.
type daemonNames struct {
	c       netio.Conn
	timeout time.Duration
	log     *slog.Logger
	serve   func(req node.Name, answer func(node.Name))
	reader  sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	next    uint64
	waiting map[uint64]func(node.Name)
	dead    error // the session is over: every request fails with it
}

// daemonDialErr says what a failed authentication with a daemon most
// likely means: the secret of --secret-file (secretFile, "" for the
// hosts of a run's spawned jobs, whose secret is the run's) is not the
// daemon's, or no daemon listens there.
func daemonDialErr(err error, secretFile string) error {
	if secretFile == "" || !errors.Is(err, netio.ErrAuth) {
		return err
	}
	return fmt.Errorf("%w (the daemon does not take the secret of --secret-file %s, or is no pmid --daemon)", err, secretFile)
}

// dialDaemonNames opens a session with the daemon at addr; serve answers
// the daemon's requests.
func dialDaemonNames(ctx context.Context, tr netio.Transport, addr string, timeout time.Duration, log *slog.Logger,
	serve func(node.Name, func(node.Name))) (*daemonNames, error) {
	c, err := tr.Dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("connect to the name service of daemon %s: %w", addr, err)
	}
	d := &daemonNames{c: c, timeout: timeout, log: log, serve: serve, waiting: map[uint64]func(node.Name){}}
	d.reader.Go(d.read)
	// Open the session at once: a connection that says nothing is
	// dropped by the daemon.
	opened := make(chan error, 1)
	d.call(node.Name{Op: "open"}, func(r node.Name) { opened <- daemonNameErr("open", "", r) })
	if err := <-opened; err != nil {
		d.Close()
		return nil, fmt.Errorf("open the name service of daemon %s: %w", addr, err)
	}
	return d, nil
}

// read delivers the daemon's answers until the session ends.
func (d *daemonNames) read() {
	for {
		f, err := d.c.Recv(context.Background())
		var m node.Name
		if err == nil && (f.Type != daemon.FrameName || node.Decode(f.Payload, &m) != nil) {
			err = fmt.Errorf("daemon sent a frame of type %#x on the name session", f.Type)
		}
		if err != nil {
			d.mu.Lock()
			d.dead = fmt.Errorf("name service: %w", err)
			waiting := d.waiting
			d.waiting = nil
			d.mu.Unlock()
			for _, done := range waiting {
				done(node.Name{Err: d.dead.Error()})
			}
			return
		}
		if m.Op != "" { // the daemon asks
			d.serve(m, d.answerDaemon)
			continue
		}
		d.mu.Lock()
		done := d.waiting[m.ID]
		delete(d.waiting, m.ID)
		d.mu.Unlock()
		if done != nil {
			done(m)
		}
	}
}

// call sends m and hands its answer to done, once.
func (d *daemonNames) call(m node.Name, done func(node.Name)) {
	d.mu.Lock()
	if d.dead != nil {
		err := d.dead
		d.mu.Unlock()
		done(node.Name{Err: err.Error()})
		return
	}
	d.next++
	m.ID = d.next
	d.waiting[m.ID] = done
	d.mu.Unlock()
	expire := func(why string) {
		d.mu.Lock()
		done, ok := d.waiting[m.ID]
		delete(d.waiting, m.ID)
		d.mu.Unlock()
		if ok {
			done(node.Name{Err: why})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	if err := d.c.Send(ctx, netio.Frame{Type: daemon.FrameName, Payload: node.Encode(m)}); err != nil {
		expire(fmt.Sprintf("name service: %v", err))
		return
	}
	// A lookup that waits for its name gives the daemon that much longer.
	time.AfterFunc(d.timeout+m.Wait, func() { expire("name service: no answer from the daemon") })
}

func (d *daemonNames) Publish(name, port string, once bool, done func(error)) {
	d.call(node.Name{Op: "publish", Name: name, Port: port, Once: once}, func(r node.Name) { done(daemonNameErr("publish", name, r)) })
}

func (d *daemonNames) Unpublish(name string, done func(error)) {
	d.call(node.Name{Op: "unpublish", Name: name}, func(r node.Name) { done(daemonNameErr("unpublish", name, r)) })
}

func (d *daemonNames) Lookup(name string, wait time.Duration, done func(string, error)) {
	d.call(node.Name{Op: "lookup", Name: name, Wait: wait}, func(r node.Name) { done(r.Port, daemonNameErr("lookup", name, r)) })
}

func daemonNameErr(op, name string, m node.Name) error {
	switch {
	case m.NotFound:
		return fmt.Errorf("%s %q: %w", op, name, agent.ErrNameNotFound)
	case m.Err != "":
		return errors.New(m.Err)
	}
	return nil
}

// Close ends the session (the daemon withdraws its names) and waits for
// the reader.
func (d *daemonNames) Close() {
	d.c.Close()
	d.reader.Wait()
}
