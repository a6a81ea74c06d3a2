package daemon

import (
	"context"
	"errors"
	"fmt"

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
// withdrawn when it ends: a run's names do not outlive it.

// serveNames serves a name-service session whose first request is first.
func (s *Server) serveNames(ctx context.Context, c netio.Conn, first netio.Frame) {
	mine := map[string]bool{} // names this session published
	defer func() {
		for name := range mine {
			s.names.Unpublish(name, func(error) {})
		}
	}()
	f := first
	for {
		var m node.Name
		if err := node.Decode(f.Payload, &m); err != nil || f.Type != FrameName {
			s.cfg.Logger.Warn("daemon: bad name request", "peer", c.RemoteAddr(), "type", f.Type, "err", err)
			return
		}
		resp := node.Name{ID: m.ID, Name: m.Name}
		answer := func(port string, err error) {
			resp.Port = port
			switch {
			case errors.Is(err, agent.ErrNameNotFound):
				resp.NotFound = true
			case err != nil:
				resp.Err = err.Error()
			}
		}
		noPort := func(err error) { answer("", err) }
		switch {
		case m.Op == "open":
			answer("", nil)
		case m.Name == "" || len(m.Name) > pmiwire.ValLenMax || len(m.Port) > pmiwire.ValLenMax:
			answer("", fmt.Errorf("name %.40q, port of %d bytes: want 1..%d bytes each", m.Name, len(m.Port), pmiwire.ValLenMax))
		case m.Op == "publish" && len(mine) >= agent.MaxNamesPerJob:
			answer("", fmt.Errorf("publish %q: %w: this run has %d names published", m.Name, agent.ErrQuota, agent.MaxNamesPerJob))
		case m.Op == "publish":
			s.names.Publish(m.Name, m.Port, func(err error) {
				if err == nil {
					mine[m.Name] = true
				}
				noPort(err)
			})
		case m.Op == "unpublish":
			s.names.Unpublish(m.Name, func(err error) {
				if err == nil {
					delete(mine, m.Name)
				}
				noPort(err)
			})
		case m.Op == "lookup":
			s.names.Lookup(m.Name, answer) // agent.Local answers before it returns
		default:
			answer("", fmt.Errorf("unknown name operation %q", m.Op))
		}
		s.reply(c, FrameName, node.Encode(resp))
		var err error
		if f, err = c.Recv(ctx); err != nil {
			return
		}
	}
}
