// Package clientseam lets the module's own benchmark code build a client
// that is not part of package client's public API: a rank played by a
// goroutine over a segment its process already holds (internal/virtual's
// virtual ranks). Package client registers the constructor when it is
// linked; nothing outside this module can import this package.
package clientseam

import (
	"errors"

	"github.com/fastpmi/fastpmi/shm"
)

// Info is what a played rank knows of itself.
type Info struct {
	Rank, Size           int
	LocalRank, LocalSize int
	JobID                string
}

// newClient is package client's constructor, set by Register.
var newClient func(seg *shm.Segment, info Info) (any, error)

// Register is called once, by package client's init.
func Register(f func(seg *shm.Segment, info Info) (any, error)) { newClient = f }

// New returns a *client.Client for local rank info.LocalRank of seg (the
// caller asserts the type: this package cannot name it). Each played rank
// needs its own client; they share seg, which the caller closes after
// every client finalized.
func New(seg *shm.Segment, info Info) (any, error) {
	if newClient == nil {
		return nil, errors.New("clientseam: package client is not linked")
	}
	return newClient(seg, info)
}
