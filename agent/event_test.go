package agent

import (
	"encoding/json"
	"strings"
	"testing"
)

// Every kind travels as its name and comes back as itself; a name no kind
// has is refused, so a node cannot send an event the root would ignore.
func TestEventKindText(t *testing.T) {
	for k := EventInit; k <= EventEnded; k++ {
		b, err := json.Marshal(Event{Kind: k, Rank: 3, Code: 7})
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		var e Event
		if err := json.Unmarshal(b, &e); err != nil || e.Kind != k || e.Rank != 3 || e.Code != 7 {
			t.Fatalf("%s: round trip gave %+v, %v", b, e, err)
		}
		if strings.HasPrefix(k.String(), "EventKind(") {
			t.Errorf("kind %d has no name", k)
		}
	}
	if _, err := json.Marshal(Event{Kind: 0}); err == nil {
		t.Error("kind 0 marshalled")
	}
	var e Event
	if err := json.Unmarshal([]byte(`{"kind":"exited","rank":1}`), &e); err == nil {
		t.Errorf("unknown kind accepted: %+v", e)
	}
	if b, _ := json.Marshal(Event{Kind: EventExited, Rank: 1, Sig: 9}); string(b) != `{"kind":"exit","rank":1,"sig":9}` {
		t.Errorf("wire form %s", b)
	}
}
