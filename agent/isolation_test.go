package agent

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// waitProtocolErrors waits until a protocol error was reported, and returns
// them all.
func (e *recEvents) waitProtocolErrors(t *testing.T, d time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		e.mu.Lock()
		got := append([]string(nil), e.protos...)
		e.mu.Unlock()
		if len(got) > 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("no protocol error reported within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A rank that enters the fence and then pipelines thousands of requests
// without reading its replies stalls only itself: the other rank, whose
// fence completes the collective, is answered at once.
func TestStuckReaderDoesNotStallOthers(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	for _, c := range cs {
		c.v1("cmd=init pmi_version=1 pmi_subversion=1")
		c.read()
	}
	flood := make(chan error, 1)
	go func() {
		// Rank 0: barrier, then 20,000 requests, never reading (its
		// writes block once the agent's replies fill the socket and the
		// agent stops reading it).
		var b strings.Builder
		b.WriteString("cmd=barrier_in\n")
		for range 20000 {
			b.WriteString("cmd=get_maxes\n")
		}
		_, err := io.WriteString(cs[0].nc, b.String())
		flood <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the flood fill the buffers
	cs[1].v1("cmd=barrier_in")
	cs[1].expect("cmd=barrier_out rc=0") // read() gives up after 5 s
	cs[1].v1("cmd=get_maxes")
	cs[1].expect("cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024")
	cs[0].nc.Close()
	<-flood
}

// Replies queued for a rank that does not read them are bounded: past
// Config.ReplyQueueBytes the rank is failed with a message naming it, and
// the rank whose put released the replies is answered.
func TestReplyQueueOverflowFailsOnlyThatRank(t *testing.T) {
	_, cs, ev := newJob(t, 2, func(c *Config) { c.ReplyQueueBytes = 256 << 10 })
	initV2(t, cs)
	const gets = 3000
	for range gets {
		cs[0].v2("cmd=kvs-get;key=big;fastpmi-wait=TRUE;")
	}
	time.Sleep(100 * time.Millisecond) // the gets are parked
	val := strings.Repeat("v", 1000)
	cs[1].v2(fmt.Sprintf("cmd=kvs-put;key=big;value=%s;fastpmi-hint=sparse;", val))
	cs[1].expect("cmd=kvs-put-response;rc=0;")
	got := ev.waitProtocolErrors(t, 5*time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "0: ") || !strings.Contains(got[0], "stopped reading") {
		t.Fatalf("protocol errors %q, want one for rank 0 saying it stopped reading", got)
	}
	// Rank 1 is still served.
	cs[1].v2("cmd=kvs-get;key=big;")
	cs[1].expect(fmt.Sprintf("cmd=kvs-get-response;rc=0;found=TRUE;value=%s;", val))
}
