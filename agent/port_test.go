package agent

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// flakyListener is a real TCP listener whose first fails Accepts fail as
// they do when the process is out of descriptors.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: errors.New("too many open files")}
	}
	return l.Listener.Accept()
}

// The PMI_PORT listener keeps accepting after transient Accept errors
// (with a back-off): a rank that connects afterwards is served.
func TestPortListenerSurvivesAcceptErrors(t *testing.T) {
	a, _, _ := newJob(t, 2, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	fl.fails.Store(5)
	a.ServeListener(fl)
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write([]byte("cmd=init pmi_version=1 pmi_subversion=1\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "cmd=response_to_init rc=0") {
		t.Fatalf("after Accept errors: %q, %v", line, err)
	}
}

// A PMI_PORT connection that the peer check refuses is closed before
// anything is read or answered; one the check accepts is served.
func TestPortPeerCheck(t *testing.T) {
	var calls atomic.Int32
	a, _, _ := newJob(t, 2, func(c *Config) {
		c.PeerCheck = func(nc net.Conn) error {
			if calls.Add(1) == 1 {
				return errors.New("stranger")
			}
			return nil
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.ServeListener(ln)
	for i, want := range []string{"", "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2\n"} {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		nc.Write([]byte("cmd=init pmi_version=1 pmi_subversion=1\n"))
		line, _ := bufio.NewReader(nc).ReadString('\n')
		nc.Close()
		if line != want {
			t.Errorf("connection %d: answered %q, want %q", i, line, want)
		}
	}
	if n := a.port.refused.Load(); n != 1 {
		t.Errorf("%d refusals counted, want 1", n)
	}
}
