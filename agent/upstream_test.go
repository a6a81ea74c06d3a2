package agent

import (
	"errors"
	"testing"
	"time"
)

// answer is one name-service answer.
type answer struct {
	port string
	err  error
}

// lookupAsync starts a lookup and returns where its answer arrives.
func lookupAsync(l *Local, name string, wait time.Duration) chan answer {
	ch := make(chan answer, 1)
	l.Lookup(name, wait, func(p string, err error) { ch <- answer{p, err} })
	return ch
}

func wantAnswer(t *testing.T, ch chan answer, port string, errIs error) {
	t.Helper()
	select {
	case a := <-ch:
		if a.port != port || !errors.Is(a.err, errIs) || (errIs == nil) != (a.err == nil) {
			t.Errorf("answer %q, %v; want %q, %v", a.port, a.err, port, errIs)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer; want %q, %v", port, errIs)
	}
}

func wantWaiting(t *testing.T, ch chan answer) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("answered %q, %v while its name was not published", a.port, a.err)
	case <-time.After(50 * time.Millisecond):
	}
}

func publish(t *testing.T, l *Local, name, port string, once bool) {
	t.Helper()
	var err error
	l.Publish(name, port, once, func(e error) { err = e })
	if err != nil {
		t.Fatalf("publish %q: %v", name, err)
	}
}

// The waits PMIx adds to the name service: a lookup that waits is
// answered by the publish that brings its name (every waiter, or with a
// name published once only the first, which takes it), by the end of
// its wait, or by Close; waiting lookups count against the cap.
func TestLocalNameWaits(t *testing.T) {
	l := NewLocalNames(3)

	a, b := lookupAsync(l, "svc", time.Minute), lookupAsync(l, "svc", time.Minute)
	wantWaiting(t, a)
	publish(t, l, "svc", "p1", false)
	wantAnswer(t, a, "p1", nil)
	wantAnswer(t, b, "p1", nil)
	wantAnswer(t, lookupAsync(l, "svc", 0), "p1", nil) // published for good: still there

	// Published once: the first waiter takes it; the next one waits on.
	a, b = lookupAsync(l, "once", time.Minute), lookupAsync(l, "once", time.Minute)
	publish(t, l, "once", "p2", true)
	wantAnswer(t, a, "p2", nil)
	wantWaiting(t, b)
	wantAnswer(t, lookupAsync(l, "once", 0), "", ErrNameNotFound)
	publish(t, l, "once", "p3", true) // not a duplicate: the first one was taken
	wantAnswer(t, b, "p3", nil)
	// Published once with no one waiting: the first lookup takes it.
	publish(t, l, "once2", "p4", true)
	wantAnswer(t, lookupAsync(l, "once2", 0), "p4", nil)
	wantAnswer(t, lookupAsync(l, "once2", 0), "", ErrNameNotFound)

	// A wait that passes is not found, after the wait.
	start := time.Now()
	wantAnswer(t, lookupAsync(l, "never", 100*time.Millisecond), "", ErrNameNotFound)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("a 100ms wait ended after %v", d)
	}

	// At most 3 lookups wait at once (the cap of names).
	w := []chan answer{lookupAsync(l, "x", time.Minute), lookupAsync(l, "y", time.Minute), lookupAsync(l, "z", time.Minute)}
	wantAnswer(t, lookupAsync(l, "w", time.Minute), "", ErrQuota)
	// Close answers them, and a later lookup does not wait.
	l.Close()
	for _, ch := range w {
		wantAnswer(t, ch, "", ErrNameNotFound)
	}
	wantAnswer(t, lookupAsync(l, "x", time.Minute), "", ErrNameNotFound)
	l.Close()
}
