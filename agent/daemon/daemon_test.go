package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/netio"
)

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secret")
	if _, err := LoadSecret(path, false); err == nil {
		t.Fatal("loaded a missing secret file without create")
	}
	a, err := LoadSecret(path, true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 || len(a) != 64 {
		t.Fatalf("new secret file: mode %v, %d bytes (%v); want 0600 and 64 hex digits", st.Mode(), len(a), err)
	}
	b, err := LoadSecret(path, true)
	if err != nil || string(a) != string(b) {
		t.Fatalf("reloading the secret: %q, %v; want %q", b, err, a)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSecret(path, false); !errors.Is(err, ErrInsecureSecret) {
		t.Errorf("secret file of mode 0640: %v, want ErrInsecureSecret", err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("too short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSecret(short, false); err == nil {
		t.Error("loaded a 9-byte secret")
	}
}

// Daemons started at once with a missing secret file (srun pmid --daemon
// on the nodes of a shared home directory) all load the one secret that
// was made: none reads the file while another still writes it, and no
// temporary file is left beside it.
func TestLoadSecretCreatedAtOnce(t *testing.T) {
	for round := range 200 {
		dir := t.TempDir()
		path := filepath.Join(dir, "secret")
		var got [8][]byte
		var errs [8]error
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() { got[i], errs[i] = LoadSecret(path, true) })
		}
		wg.Wait()
		for i := range got {
			if errs[i] != nil || !bytes.Equal(got[i], got[0]) {
				t.Fatalf("round %d: daemon %d loaded %q, %v; daemon 0 loaded %q", round, i, got[i], errs[i], got[0])
			}
		}
		if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 {
			t.Fatalf("round %d: %d files beside the secret (%v), want only it", round, len(ents), err)
		}
	}
}

// A server answers status, refuses a bad submission, and its Serve
// returns after cancellation having ended every goroutine it started.
func TestServerRefusesAndShutsDown(t *testing.T) {
	before := runtime.NumGoroutine()
	secret := []byte("0123456789abcdef0123456789abcdef")
	s, err := New(Config{Listen: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- s.Serve(ctx) }()

	tr, err := NewTransport(secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer qcancel()
	c, err := tr.Dial(qctx, s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	spec := &node.Spec{JobID: "j", Size: 2, Nodes: [][]int{{0}}, Usize: -1, Apps: []node.App{{Prog: "true", Size: 2}},
		KillGrace: time.Second, DisconnectGrace: time.Second}
	if err := c.Send(qctx, netio.Frame{Type: FrameSubmit, Payload: node.Encode(Submit{Spec: spec})}); err != nil {
		t.Fatal(err)
	}
	f, err := c.Recv(qctx)
	var ex Exit
	if err != nil || f.Type != FrameExit || node.Decode(f.Payload, &ex) != nil || ex.Err == "" {
		t.Fatalf("answer to a bad spec: type %#x %q (%v), want a refusing Exit", f.Type, f.Payload, err)
	}
	c.Close()
	st, err := QueryStatus(qctx, tr, s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if st.Refused != 1 || len(st.Jobs) != 0 || st.PID != os.Getpid() || st.MaxJobs != DefaultMaxJobs {
		t.Errorf("status %+v: want 1 refused, no job, this pid, default max jobs", st)
	}
	tr.Close()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancellation")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Serve returned, %d before New", n, before)
	}
}

// What a job's node logs on a daemon names the job and the node once
// each: here the node's failed authentication to a root that has another
// secret, and the daemon's note that the node ended.
func TestDaemonJobLogNamesNodeOnce(t *testing.T) {
	var logged syncbuf.Buffer
	secret := []byte("0123456789abcdef0123456789abcdef")
	s, err := New(Config{Listen: "127.0.0.1:0", Secret: secret, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		cancel()
		<-served
	}()
	// A root that does not know the job's secret.
	rtr, err := NewTransport([]byte("not the job's secret, another one"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rtr.Close()
	rln, err := rtr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rln.Close()

	tr, err := NewTransport(secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	qctx, qcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer qcancel()
	c, err := tr.Dial(qctx, s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := &node.Spec{JobID: "logjob", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Apps: []node.App{{Prog: "true", Size: 1}},
		KillGrace: time.Second, DisconnectGrace: time.Second, TreeWidth: 2, NetTimeout: time.Second,
		Root: rln.Addr().String(), Secret: []byte("the job's own secret, 32 bytes..")}
	if err := c.Send(qctx, netio.Frame{Type: FrameSubmit, Payload: node.Encode(Submit{Spec: spec})}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.Recv(qctx)
		if err != nil {
			t.Fatalf("no Exit frame: %v", err)
		}
		if f.Type == FrameExit {
			break
		}
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("logged %q, want the node's failure and the daemon's note", logged.String())
	}
	for _, l := range lines {
		if strings.Count(l, " node=0") != 1 || strings.Count(l, " job=logjob") != 1 {
			t.Errorf("log line does not name node 0 and the job once each: %s", l)
		}
	}
}

// A submission from a pmirun of another fastpmi build, whose spec has a
// field this daemon does not know, is refused naming the field and the
// builds, not run without what the field asked for.
func TestServerRefusesUnknownSpecField(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	s, err := New(Config{Listen: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	tr, err := NewTransport(secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer qcancel()
	c, err := tr.Dial(qctx, s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := &node.Spec{JobID: "j", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Apps: []node.App{{Prog: "true", Size: 1}},
		KillGrace: time.Second, DisconnectGrace: time.Second, Root: "127.0.0.1:1", Secret: secret, TreeWidth: 2, NetTimeout: time.Second}
	payload := bytes.Replace(node.Encode(Submit{Spec: spec}), []byte(`"spec":{`), []byte(`"spec":{"ranks_nice":5,`), 1)
	if err := c.Send(qctx, netio.Frame{Type: FrameSubmit, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	f, err := c.Recv(qctx)
	var ex Exit
	if err != nil || f.Type != FrameExit || node.Decode(f.Payload, &ex) != nil {
		t.Fatalf("answer: type %#x %q (%v), want an Exit", f.Type, f.Payload, err)
	}
	for _, want := range []string{"daemon refused the job", `unknown field "ranks_nice"`, "another fastpmi build"} {
		if !strings.Contains(ex.Err, want) {
			t.Errorf("refusal %q does not say %q", ex.Err, want)
		}
	}
}
