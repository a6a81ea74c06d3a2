package perftest

import (
	"strings"
	"testing"
)

const meta = `{"name":"process_name","ph":"M","pid":1,"args":{"name":"p"}},{"name":"thread_name","ph":"M","pid":1,"tid":0,"args":{"name":"t"}}`

func TestCheck(t *testing.T) {
	good := `{"traceEvents":[` + meta + `,
		{"name":"a","ph":"X","ts":0,"dur":10,"pid":1,"tid":0},
		{"name":"b","ph":"X","ts":1,"dur":4,"pid":1,"tid":0},
		{"name":"m","ph":"i","s":"t","ts":2,"pid":1,"tid":0},
		{"name":"c","ph":"X","ts":5,"dur":5,"pid":1,"tid":0},
		{"name":"n","ph":"C","ts":6,"pid":1,"args":{"value":3}},
		{"name":"x","ph":"B","ts":11,"pid":1,"tid":0},{"name":"x","ph":"E","ts":12,"pid":1,"tid":0}]}`
	tr, err := Check([]byte(good))
	if err != nil {
		t.Fatalf("good trace refused: %v", err)
	}
	if len(tr.Events) != 7 || tr.Threads[Track{1, 0}] != "t" || tr.Processes[1] != "p" {
		t.Errorf("decoded %+v", tr)
	}
	for _, c := range []struct{ name, events, want string }{
		{"overlap", `{"name":"a","ph":"X","ts":0,"dur":10,"pid":1,"tid":0},{"name":"b","ph":"X","ts":5,"dur":10,"pid":1,"tid":0}`, "overlaps"},
		{"back in time", `{"name":"a","ph":"i","ts":5,"pid":1,"tid":0},{"name":"b","ph":"i","ts":4,"pid":1,"tid":0}`, "goes back"},
		{"no dur", `{"name":"a","ph":"X","ts":0,"pid":1,"tid":0}`, "dur"},
		{"negative dur", `{"name":"a","ph":"X","ts":0,"dur":-1,"pid":1,"tid":0}`, "dur"},
		{"unknown phase", `{"name":"a","ph":"Q","ts":0,"pid":1,"tid":0}`, "unknown phase"},
		{"no name", `{"ph":"i","ts":0,"pid":1,"tid":0}`, "name"},
		{"unnamed track", `{"name":"a","ph":"i","ts":0,"pid":1,"tid":7}`, "thread_name"},
		{"counter text", `{"name":"n","ph":"C","ts":0,"pid":1,"args":{"value":"x"}}`, "not a number"},
		{"unbalanced", `{"name":"x","ph":"B","ts":0,"pid":1,"tid":0}`, "never end"},
		{"bad scope", `{"name":"a","ph":"i","s":"q","ts":0,"pid":1,"tid":0}`, "scope"},
	} {
		_, err := Check([]byte(`{"traceEvents":[` + meta + `,` + c.events + `]}`))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if _, err := Check([]byte(`[]`)); err == nil {
		t.Error("a JSON array passed as a trace object")
	}
}
