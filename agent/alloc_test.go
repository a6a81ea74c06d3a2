package agent

import (
	"io"
	"testing"
)

// A PMI-2 get served over a rank's socket allocates what it must (the
// request's body and fields, the request's record, the core operation,
// the response) and no more: the decoded message is not made anew for
// every read (the record holds a copy).
func TestTextGetAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	_, cs, _ := newJob(t, 1, nil)
	c := cs[0]
	c.v2("cmd=fullinit;pmijobid=job-1;pmirank=0;threaded=FALSE;")
	c.read()
	c.v2("cmd=kvs-put;key=card;value=tcp://10.0.0.1:5000;")
	c.expect("cmd=kvs-put-response;rc=0;")
	c.v2("cmd=kvs-fence;")
	c.expect("cmd=kvs-fence-response;rc=0;")
	body := "cmd=kvs-get;jobid=job-1;srcid=0;key=card;"
	req := append(pmiwireHeader(len(body)), body...)
	want := "cmd=kvs-get-response;rc=0;found=TRUE;value=tcp://10.0.0.1:5000;"
	reply := make([]byte, 6+len(want))
	get := func() {
		if _, err := c.nc.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c.nc, reply); err != nil {
			t.Fatal(err)
		}
	}
	get()
	if string(reply[6:]) != want {
		t.Fatalf("reply %q, want %q", reply, want)
	}
	// body string, fields, textReq, the Get operation, Resp, reply buffer
	const most = 6
	if n := testing.AllocsPerRun(500, get); n > most {
		t.Errorf("%.1f allocations a get, want at most %d", n, most)
	}
}
