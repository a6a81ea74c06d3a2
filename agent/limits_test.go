package agent

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// NUL bytes in keys and values are refused the same way on PMI-1, PMI-2
// and shared memory (where a put has no reply: the rank is failed).
func TestNULRejectedOnEveryPath(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	cs[0].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[0].read()
	cs[0].v1("cmd=put kvsname=job-1 key=k value=a\x00b")
	if got := cs[0].read(); !strings.HasPrefix(got, "cmd=put_result rc=") || strings.HasPrefix(got, "cmd=put_result rc=0") {
		t.Errorf("PMI-1 put of a NUL value answered %q", got)
	}
	initV2(t, cs[1:2])
	cs[1].v2("cmd=kvs-put;key=k\x00;value=v;")
	if got := cs[1].read(); strings.Contains(got, "rc=0;") || !strings.Contains(got, "NUL") {
		t.Errorf("PMI-2 put of a NUL key answered %q", got)
	}
	cs[1].v2("cmd=kvs-put;key=k;value=v\x00;")
	if got := cs[1].read(); strings.Contains(got, "rc=0;") || !strings.Contains(got, "NUL") {
		t.Errorf("PMI-2 put of a NUL value answered %q", got)
	}

	_, seg, ev := shmJob(t, 1)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	r.push(shm.OpPut, shm.AppendPair(nil, "k", "v\x00"))
	got := ev.waitProtocolErrors(t, 5*time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "0: ") || !strings.Contains(got[0], "NUL") {
		t.Errorf("shm put of a NUL value: protocol errors %q", got)
	}
}

// One rank's put volume is bounded: the put past MaxPutsPerRank is refused
// with rc≠0, and the rank is still served.
func TestPutQuota(t *testing.T) {
	_, cs, _ := newJob(t, 1, nil)
	initV2(t, cs)
	c := cs[0]
	go func() {
		w := bufio.NewWriterSize(c.nc, 1<<16)
		for i := range MaxPutsPerRank + 1 {
			s := fmt.Sprintf("cmd=kvs-put;key=k%d;value=v;", i)
			fmt.Fprintf(w, "%6d%s", len(s), s)
		}
		w.Flush()
	}()
	for i := range MaxPutsPerRank + 1 {
		c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		got := c.read()
		if i < MaxPutsPerRank && got != "cmd=kvs-put-response;rc=0;" {
			t.Fatalf("put %d answered %q", i, got)
		}
		if i == MaxPutsPerRank && (strings.Contains(got, "rc=0;") || !strings.Contains(got, "quota exceeded")) {
			t.Fatalf("put %d past the quota answered %q", i, got)
		}
	}
	c.v2("cmd=kvs-get;key=k1;")
	c.read()
}

// The node's attributes are bounded: past MaxNodeAttrs keys a new key is
// refused with rc≠0 (shm: an error response) while replacing one still
// works; one too large for the byte quota is refused too.
func TestNodeAttrQuota(t *testing.T) {
	_, seg, _ := shmJob(t, 1)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	for i := range MaxNodeAttrs {
		seq := r.push(shm.OpPutNodeAttr, shm.AppendPair(nil, fmt.Sprint("a", i), "v"))
		r.expect(shm.OpPutNodeAttr, seq, shm.StatusOK, "")
	}
	seq := r.push(shm.OpPutNodeAttr, shm.AppendPair(nil, "one-more", "v"))
	r.expect(shm.OpPutNodeAttr, seq, shm.StatusError, fmt.Sprintf("quota exceeded: the job's ranks on this node hold %d node attributes (%d bytes); the limit is %d or %d bytes",
		MaxNodeAttrs, nodeAttrBytes(MaxNodeAttrs), MaxNodeAttrs, MaxNodeAttrBytes))
	seq = r.push(shm.OpPutNodeAttr, shm.AppendPair(nil, "a7", "replaced"))
	r.expect(shm.OpPutNodeAttr, seq, shm.StatusOK, "")
	seq = r.push(shm.OpGetNodeAttr, []byte("a7"))
	r.expect(shm.OpGetNodeAttr, seq, shm.StatusOK, "replaced")
	// A name no put can make is not found, as over the text protocol
	// (it was refused as an error here).
	seq = r.push(shm.OpGetNodeAttr, []byte(strings.Repeat("k", pmiwire.KeyLenMax+1)))
	r.expect(shm.OpGetNodeAttr, seq, shm.StatusNotFound, "")

	_, cs, _ := newJob(t, 1, nil)
	initV2(t, cs)
	big := strings.Repeat("b", 1000)
	for i := 0; ; i++ {
		cs[0].v2(fmt.Sprintf("cmd=info-putnodeattr;key=k%d;value=%s;", i, big))
		got := cs[0].read()
		if strings.Contains(got, "rc=0;") {
			if i > MaxNodeAttrBytes/len(big) {
				t.Fatalf("node attribute %d of %d bytes accepted past the %d-byte quota", i, len(big), MaxNodeAttrBytes)
			}
			continue
		}
		if !strings.Contains(got, "quota exceeded") {
			t.Fatalf("node attribute %d refused with %q, want quota exceeded", i, got)
		}
		break
	}
}

// nodeAttrBytes is the bytes of node attributes a0..a(n-1), each "v".
func nodeAttrBytes(n int) int {
	b := 0
	for i := range n {
		b += len(fmt.Sprint("a", i)) + 1
	}
	return b
}

// A connection may have at most MaxPendingPerConn requests waiting; the
// next is refused with rc≠0.
func TestPendingQuota(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	var b strings.Builder
	for range MaxPendingPerConn + 1 {
		s := "cmd=kvs-get;key=never;fastpmi-wait=TRUE;"
		fmt.Fprintf(&b, "%6d%s", len(s), s)
	}
	cs[0].send(b.String())
	got := cs[0].read()
	if strings.Contains(got, "rc=0;") || !strings.Contains(got, "quota exceeded") {
		t.Fatalf("request past the pending quota answered %q", got)
	}
	// A refused PMI-1.2 group barrier carries its tag: a threaded client
	// finds its answer by it.
	_, cs, _ = newJob(t, 2, nil)
	cs[0].v1("cmd=init pmi_version=1 pmi_subversion=2")
	cs[0].read()
	b.Reset()
	for i := range MaxPendingPerConn + 1 {
		fmt.Fprintf(&b, "cmd=barrier_in group=0,1:t%d\n", i)
	}
	cs[0].send(b.String())
	got = cs[0].read()
	if want := fmt.Sprintf("tag=t%d", MaxPendingPerConn); strings.Contains(got, "rc=0") || !strings.Contains(got, want) {
		t.Fatalf("group barrier past the pending quota answered %q, want rc≠0 and %s", got, want)
	}
}

// Published names and ports are bounded and NUL-free on both paths.
func TestNameLimits(t *testing.T) {
	_, cs, _ := newJob(t, 1, nil)
	initV2(t, cs)
	cs[0].v2("cmd=name-publish;name=" + strings.Repeat("n", MaxNameLen+1) + ";port=p;")
	if got := cs[0].read(); strings.Contains(got, "rc=0;") {
		t.Errorf("long name published: %q", got)
	}
	cs[0].v2("cmd=name-publish;name=n;port=" + strings.Repeat("p", MaxPortLen+1) + ";")
	if got := cs[0].read(); strings.Contains(got, "rc=0;") {
		t.Errorf("long port published: %q", got)
	}
	_, seg, _ := shmJob(t, 1)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	seq := r.push(shm.OpPublish, shm.AppendPair(nil, "n\x00", "p"))
	r.expect(shm.OpPublish, seq, shm.StatusError, "service name holds a NUL byte")
}

// A Local name service holds at most MaxNamesPerJob names: the next
// publish fails with ErrQuota until one is withdrawn; NewLocalNames(0)
// sets no cap.
func TestNameCap(t *testing.T) {
	publish := func(l *Local, name string) (err error) {
		l.Publish(name, "p", false, func(e error) { err = e })
		return err
	}
	l := NewLocal()
	for i := range MaxNamesPerJob {
		if err := publish(l, fmt.Sprint("n", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := publish(l, "one-more"); !errors.Is(err, ErrQuota) {
		t.Fatalf("publish %d: %v, want ErrQuota", MaxNamesPerJob+1, err)
	}
	if err := publish(l, "n0"); !errors.Is(err, ErrNameExists) {
		t.Errorf("publish of a published name at the cap: %v, want ErrNameExists", err)
	}
	l.Unpublish("n0", func(error) {})
	if err := publish(l, "one-more"); err != nil {
		t.Errorf("publish after an unpublish: %v", err)
	}
	u := NewLocalNames(0)
	for i := range MaxNamesPerJob + 1 {
		if err := publish(u, fmt.Sprint("n", i)); err != nil {
			t.Fatalf("uncapped publish %d: %v", i, err)
		}
	}
}
