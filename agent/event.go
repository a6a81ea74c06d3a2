package agent

import "fmt"

// EventKind is what happened to a rank. The agent (its core and its
// front ends) reports the first five kinds and EventEnded; the node's shell (agent/node),
// which owns the rank's process, judges the process's end and adds the last
// three. One enum for every stage: the core's Ready, Config.Events, the
// node's loop and the node-to-root wire (which spells it as text).
type EventKind uint8

const (
	// EventInit: the rank sent its first PMI command (init or fullinit).
	EventInit EventKind = iota + 1
	// EventFinalized: the rank completed PMI finalize.
	EventFinalized
	// EventAbort: the rank asked to abort the job with Code and Msg.
	EventAbort
	// EventDisconnected: the rank's PMI connection closed before finalize
	// (Spoke: after it spoke PMI). The shell judges what it means.
	EventDisconnected
	// EventProtocol: the rank sent something the agent could not frame
	// or serve (Msg); its connection was closed. Rank -1: no rank can be
	// blamed (a corrupt segment header).
	EventProtocol
	// EventExited: the rank's process ended (Code, Sig; Spoke and Fin say
	// how far it got in PMI), judged once the agent has served everything
	// it sent.
	EventExited
	// EventLost: the rank's PMI connection closed before finalize and its
	// process still runs after the grace period (Spoke: after it spoke
	// PMI).
	EventLost
	// EventStartFailed: the rank could not be started (Code: the job's exit
	// code, Msg: why).
	EventStartFailed
	// EventEnded: the agent ends the job for the rank (Code: the job's
	// exit code, Msg: why): a failure the rank's own library cannot tell
	// its peers, who would wait for it for ever (agent/pmix: a failed
	// spawn of a parent job of several ranks, as Open MPI 4.1 shares the
	// outcome only when the spawn succeeds).
	EventEnded
)

// eventNames are the kinds' names, as the wire spells them.
var eventNames = [...]string{
	EventInit: "init", EventFinalized: "finalized", EventAbort: "abort",
	EventDisconnected: "disconnected", EventProtocol: "protocol",
	EventExited: "exit", EventLost: "lost", EventStartFailed: "start",
	EventEnded: "ended",
}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// MarshalText spells the kind by name.
func (k EventKind) MarshalText() ([]byte, error) {
	if int(k) >= len(eventNames) || eventNames[k] == "" {
		return nil, fmt.Errorf("unknown rank event kind %d", uint8(k))
	}
	return []byte(eventNames[k]), nil
}

// UnmarshalText reads a kind's name; an unknown name is an error.
func (k *EventKind) UnmarshalText(b []byte) error {
	for i, n := range eventNames {
		if n != "" && n == string(b) {
			*k = EventKind(i)
			return nil
		}
	}
	return fmt.Errorf("unknown rank event kind %q", b)
}

// Event is one thing that happened to a rank, for the job's fate: the
// agent reports it through Config.Events, the node's shell judges process
// ends and sends every event to the root as it is.
type Event struct {
	Kind EventKind `json:"kind"`
	Rank int       `json:"rank"` // global; -1 for a segment no rank can be blamed for
	// Code is the abort code (EventAbort), the exit code (EventExited) or
	// the job's exit code (EventStartFailed).
	Code int `json:"code,omitempty"`
	// Sig is the signal that killed the process (EventExited).
	Sig int `json:"sig,omitempty"`
	// Msg is the abort message, the error, or what an exit means.
	Msg string `json:"msg,omitempty"`
	// Spoke says the rank had spoken PMI (EventDisconnected, EventLost,
	// EventExited);
	// Fin that it had finalized (EventExited).
	Spoke bool `json:"spoke,omitempty"`
	Fin   bool `json:"fin,omitempty"`
}

// protocolError reports that rank (-1: none can be blamed) sent something
// the agent could not frame or serve. The launcher says it as the job's
// fate: the front ends log it at Info, for --verbose, not as a warning
// that would say it a second time.
func (a *Agent) protocolError(rank int, err error) {
	a.cfg.Events(Event{Kind: EventProtocol, Rank: rank, Msg: err.Error()})
}
