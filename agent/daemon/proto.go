package daemon

import (
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
)

// Frame types on a connection to the daemon. They are numbered apart from
// the job protocol's (node.Frame*) so a frame on the wrong link is plainly
// foreign. Control frames are JSON (node.Encode); output and input frames
// carry bytes as they are.
const (
	FrameSubmit   uint16 = 0x100 // client → daemon, first frame: Submit
	FrameStatus   uint16 = 0x101 // client → daemon, first frame: status request; daemon → client: Status
	FrameStdout   uint16 = 0x102 // daemon → client: the ranks' stdout, whole lines
	FrameStderr   uint16 = 0x103 // daemon → client: the ranks' stderr, whole lines
	FrameStdin    uint16 = 0x104 // client → daemon: rank 0's input
	FrameStdinEOF uint16 = 0x105 // client → daemon: rank 0's input ended
	FrameKill     uint16 = 0x106 // client → daemon: end the job's ranks now
	FrameNotice   uint16 = 0x107 // daemon → client: node.Ending, the daemon ends the job (shutdown)
	FrameExit     uint16 = 0x108 // daemon → client, last frame: Exit
	FrameName     uint16 = 0x109 // client → daemon, first frame and after: node.Name request; daemon → client: its response (names.go)
)

// MaxFrame bounds every frame on a daemon connection, both ways: a
// submission of the largest job (node.MaxRanks ranks) fits.
const MaxFrame = 16 << 20

// DefaultMaxJobs bounds the jobs a daemon runs at once when
// Config.MaxJobs is 0.
const DefaultMaxJobs = 64

// Submit is one node of one job for the daemon to run.
type Submit struct {
	Node int        `json:"node"` // index in Spec.Nodes
	Spec *node.Spec `json:"spec"`
}

// Exit ends a submission: Err is empty when the node's ranks ran to
// their end (the job's fate is pmirun's to judge), else why the daemon
// could not run or finish the node.
type Exit struct {
	Err string `json:"err,omitempty"`
}

// Status is a daemon's answer to a status request (pmid --status).
type Status struct {
	PID     int           `json:"pid"`
	Addr    string        `json:"addr"`
	Uptime  time.Duration `json:"uptime_ns"`
	MaxJobs int           `json:"max_jobs"`
	Jobs    []JobStatus   `json:"jobs"`
	Served  uint64        `json:"served"`  // submissions run to their end
	Refused uint64        `json:"refused"` // submissions refused
	// Strangers is how many connections were dropped before they
	// authenticated (netio.Listener.Refused).
	Strangers  int64 `json:"strangers"`
	Goroutines int   `json:"goroutines"`
	Threads    int   `json:"threads"` // -1 where unknown
	FDs        int   `json:"fds"`     // open descriptors (this status connection's included); -1 where unknown
	Memfds     int   `json:"memfds"`  // of which memfd segments; -1 where unknown
}

// JobStatus is one running job's node.
type JobStatus struct {
	JobID   string        `json:"jobid"`
	Node    int           `json:"node"`
	Ranks   int           `json:"ranks"`
	Running time.Duration `json:"running_ns"`
}
