package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// The daemon's name service. A run on daemons keeps its names at the
// daemon of its first node, so that jobs launched separately on the same
// daemons find each other by name (MPI_Publish_name and MPI_Lookup_name
// between an MPI_Comm_accept server and its MPI_Comm_connect clients). A
// run opens one session — a connection whose first frame is a FrameName
// request, Op "open" at once (the daemon drops connections silent for
// long) — and sends node.Name requests on it, each answered by a
// node.Name response with the same ID. The names a session published are
// withdrawn when it ends: a run's names do not outlive it (a name
// published to go at its first lookup, node.Name.Once, may have gone
// before). A session withdraws only names it published (the session is
// their owner in the name service): never another run's, also not one
// published under the same name after its own had gone.

// serveNames serves a name-service session whose first request is first.
// Requests are answered in order, at once, but for lookups that wait for
// their name: those are answered when the name comes (from the
// publisher's goroutine), when their wait is over or when the daemon's
// name service closes, whichever is first — possibly after the session
// ended, when the answer is dropped. A session has at most
// agent.MaxNamesPerJob names published and lookups waiting. Requests
// about jobs (registering the run's jobs, collectives and questions about
// another run's jobs) are the directory's (jobs.go); the session's jobs
// are withdrawn when it ends.
func (s *Server) serveNames(ctx context.Context, c netio.Conn, first netio.Frame) {
	var mu sync.Mutex
	// Guarded by mu: the names this session published, and its lookups
	// still waiting.
	mine := map[string]bool{}
	waiting := 0
	sess := s.newSession(c)
	defer sess.end()
	defer func() {
		mu.Lock()
		names := slices.Collect(maps.Keys(mine))
		mu.Unlock()
		for _, name := range names {
			s.names.UnpublishAs(sess, name, func(error) {})
		}
	}()
	f := first
	for {
		var m node.Name
		if err := node.Decode(f.Payload, &m); err != nil || f.Type != FrameName {
			s.cfg.Logger.Warn("daemon: bad name request", "peer", c.RemoteAddr(), "type", f.Type, "err", err)
			return
		}
		answer := func(port string, err error) {
			resp := node.Name{ID: m.ID, Name: m.Name, Port: port}
			switch {
			case errors.Is(err, agent.ErrNameNotFound):
				resp.NotFound = true
			case err != nil:
				resp.Err = err.Error()
			}
			s.reply(c, FrameName, node.Encode(resp))
		}
		noPort := func(err error) { answer("", err) }
		job := sess.serveJob(&m, func(r node.Name) { // a request about jobs (jobs.go)
			r.ID = m.ID
			s.reply(c, FrameName, node.Encode(r))
		})
		mu.Lock()
		if m.Op == "publish" && len(mine) >= agent.MaxNamesPerJob {
			// Names published once go at their first lookup, elsewhere:
			// count only those still the session's.
			for name := range mine {
				if !s.names.Owns(sess, name) {
					delete(mine, name)
				}
			}
		}
		published, waits := len(mine), waiting
		mu.Unlock()
		switch {
		case job: // served
		case m.Op == "open":
			answer("", nil)
		case m.Name == "" || len(m.Name) > pmiwire.ValLenMax || len(m.Port) > pmiwire.ValLenMax:
			answer("", fmt.Errorf("name %.40q, port of %d bytes: want 1..%d bytes each", m.Name, len(m.Port), pmiwire.ValLenMax))
		case m.Op == "publish" && published >= agent.MaxNamesPerJob:
			answer("", fmt.Errorf("publish %q: %w: this run has %d names published", m.Name, agent.ErrQuota, agent.MaxNamesPerJob))
		case m.Op == "publish":
			s.names.PublishAs(sess, m.Name, m.Port, m.Once, func(err error) {
				if err == nil {
					mu.Lock()
					mine[m.Name] = true
					mu.Unlock()
				}
				noPort(err)
			})
		case m.Op == "unpublish":
			s.names.UnpublishAs(sess, m.Name, func(err error) {
				if err == nil {
					mu.Lock()
					delete(mine, m.Name)
					mu.Unlock()
				}
				noPort(err)
			})
		case m.Op == "lookup" && m.Wait > 0 && waits >= agent.MaxNamesPerJob:
			answer("", fmt.Errorf("lookup %q: %w: this run has %d lookups waiting", m.Name, agent.ErrQuota, agent.MaxNamesPerJob))
		case m.Op == "lookup":
			wait := min(m.Wait, agent.MaxNameWait)
			if wait > 0 {
				mu.Lock()
				waiting++
				mu.Unlock()
			}
			s.names.Lookup(m.Name, wait, func(port string, err error) {
				if wait > 0 {
					mu.Lock()
					waiting--
					mu.Unlock()
				}
				answer(port, err)
			})
		default:
			answer("", fmt.Errorf("unknown name operation %q", m.Op))
		}
		var err error
		if f, err = c.Recv(ctx); err != nil {
			return
		}
	}
}
