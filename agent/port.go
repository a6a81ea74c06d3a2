package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// PMI_PORT mode: ranks connect to a TCP listener instead of inheriting a
// socketpair, so anyone who can reach the port can try to be a rank. A
// connection is served only if Config.PeerCheck accepts it (the node
// checks that the peer's socket belongs to the job's user); it must then
// bind to a rank within preAuthTimeout, by a PMI_ID token (Config.IDs,
// unguessable, one per rank) on PMI-1 initack, or by a token or rank
// number on PMI-2 fullinit; at most maxUnbound connections wait unbound at
// a time. Refusals are logged once, then counted (a summary at Close).
// The accept loop survives transient errors (fd exhaustion) with a
// back-off, logging the first.

const (
	// preAuthTimeout bounds how long a PMI_PORT connection may stay silent
	// or unbound.
	preAuthTimeout = 10 * time.Second
	// acceptBackoffMax bounds the pause after a failed Accept.
	acceptBackoffMax = time.Second
)

// maxUnbound is how many PMI_PORT connections may wait unbound at once:
// every local rank connecting twice, and some.
func (a *Agent) maxUnbound() int { return 2*len(a.ranks) + 16 }

// portStats counts PMI_PORT refusals; logged is set by the first.
type portStats struct {
	refused      atomic.Int64 // connections refused (peer check, pre-auth limits)
	logged       atomic.Bool  // the first refusal was logged
	acceptLogged atomic.Bool  // the first Accept error was logged
}

// refuse drops a PMI_PORT connection that may not be served: counted
// first, so that the count holds it once the peer sees the connection end.
func (a *Agent) refuse(nc net.Conn, why error) {
	a.port.refused.Add(1)
	nc.Close()
	if a.port.logged.CompareAndSwap(false, true) {
		a.log.Warn("PMI_PORT connection refused (further refusals are counted, not logged)",
			"peer", nc.RemoteAddr().String(), "err", why)
	}
}

// acceptLoop accepts on ln until it is closed.
func (a *Agent) acceptLoop(ln net.Listener) {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE, ENFILE, ECONNABORTED...: wait and accept again.
			if a.port.acceptLogged.CompareAndSwap(false, true) {
				a.log.Warn("accept PMI_PORT connection; retrying with back-off", "err", err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), acceptBackoffMax)
			select {
			case <-time.After(delay):
			case <-a.closing:
				return
			}
			continue
		}
		delay = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		a.mu.Lock()
		full := a.unbound >= a.maxUnbound()
		a.mu.Unlock()
		if full {
			a.refuse(nc, fmt.Errorf("%d connections already wait unbound", a.maxUnbound()))
			continue
		}
		if err := a.ServeUnbound(nc); errors.Is(err, ErrClosed) {
			return
		}
	}
}

// admitLocked starts the pre-authentication of a PMI_PORT connection:
// counted as unbound, with a deadline to bind. Under a.mu.
func (c *textConn) admitLocked() {
	c.a.unbound++
	c.unbound = true
	_ = c.nc.SetReadDeadline(time.Now().Add(preAuthTimeout))
}

// boundLocked ends c's pre-authentication once it has a rank. Under a.mu.
func (c *textConn) boundLocked() {
	if c.unbound {
		c.unbound = false
		c.a.unbound--
		_ = c.nc.SetReadDeadline(time.Time{})
	}
}

// checkPeer runs Config.PeerCheck on an unbound connection before its
// first byte is read; false means it was refused and closed.
func (c *textConn) checkPeer() bool {
	if c.a.cfg.PeerCheck == nil {
		return true
	}
	if err := c.a.cfg.PeerCheck(c.nc); err != nil {
		c.a.refuse(c.nc, err)
		return false
	}
	return true
}

// rankOfID maps a PMI_ID as a PMI-1 client presents it at initack to its
// global rank: the rank's token when Config.IDs is set, else the rank
// number itself.
func (a *Agent) rankOfID(id string) (int, error) {
	if a.ids == nil {
		r, err := strconv.Atoi(id)
		if err != nil {
			return -1, fmt.Errorf("bad pmiid %q", id)
		}
		return r, nil
	}
	if r, ok := a.ids[id]; ok {
		return r, nil
	}
	return -1, errors.New("pmiid is not one of this job's PMI_ID values")
}

// rankOfPMI2 maps a PMI-2 fullinit's pmirank (or srcid) to a global rank:
// a PMI_ID token, or a rank number (the peer check has vouched for the
// connection's user).
func (a *Agent) rankOfPMI2(s string) (int, error) {
	if r, ok := a.ids[s]; ok {
		return r, nil
	}
	return strconv.Atoi(s)
}
