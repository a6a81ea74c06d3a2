package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// -spawn refuses a -timeout no run could meet, before any run: with
// '-timeout 0s' it ran every job, each ending at once with 'context
// deadline exceeded' (exit 1). Each bad value is refused under its own
// flag's name, as in the other modes (it said "-count 0, -rounds 2").
func TestSpawnFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-timeout", "0s"}, "parse -timeout: 0s is not positive"},
		{[]string{"-count", "0"}, "parse -count: 0 is below 1"},
		{[]string{"-rounds", "0"}, "parse -rounds: 0 is below 1"},
		{[]string{"-nodes", "1"}, "parse -nodes: 1 is below 2"},
		{[]string{"-rate-time", "-1s"}, "parse -rate-time: -1s is negative"},
	} {
		if _, err := parseSpawnFlags(c.args, io.Discard); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
}

// Ctrl-C during -spawn says the stop once, and the job it ended is no
// failed job: it was said as one ('... rate 10.000: exit status 143:
// pmirun: job 75 rank 0 killed by signal 15 (SIGTERM) ...'), and the
// stop not at all.
func TestSpawnInterrupted(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", filepath.Join(dir, "pmid"), "../pmid").CombinedOutput(); err != nil {
		t.Fatalf("build pmid: %v\n%s", err, out)
	}
	// The "pmirun" interrupts pmibench (this test), then waits to be
	// ended with its job.
	pmirun := filepath.Join(dir, "pmirun")
	if err := os.WriteFile(pmirun, []byte("#!/bin/sh\nkill -INT "+strconv.Itoa(os.Getpid())+"\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGINT)
	defer stop()
	var stdout bytes.Buffer
	var stderr syncbuf.Buffer // the daemons write to it too
	args := []string{"-spawn", "-pmirun", pmirun, "-prog", "/bin/true", "-sizes", "1", "-count", "1", "-rounds", "1", "-rate-time", "1s"}
	if code := run(ctx, args, &stdout, &stderr); code != 1 {
		t.Errorf("exit %d, want 1\n%s\n%s", code, stdout.String(), stderr.String())
	}
	if got := stderr.String(); strings.Count(got, "stopped early: interrupt signal received") != 1 || strings.Contains(got, pmirun+" ") {
		t.Errorf("stderr:\n%s\nwant the stop once and no failed job", got)
	}
}

// A rate the test did not measure (stopped before it, or its job failed)
// is printed as "-", as the latency table prints a size it did not time:
// it was printed as "0  0.00  0.0", a rate of 0 spawns a second.
func TestSpawnRateNotMeasured(t *testing.T) {
	measured := &spawnRow{setup: spawnSetup{1, "per-job", "pmirun", nil, nil}, spawns: 50, secs: 2}
	missing := &spawnRow{setup: spawnSetup{1, "daemon", "pmirun", nil, nil}}
	missing.vs = &spawnRatio{slow: measured, fast: missing}
	var out bytes.Buffer
	writeSpawnTables(&out, spawnOptions{sizes: []int{1}, rateTime: time.Second}, []*spawnRow{measured, missing})
	text := out.String()
	if !strings.Contains(text, "1\tper-job\t50\t2.00\t25.0\t\n") || !strings.Contains(text, "1\tdaemon\t-\t-\t-\t\n") {
		t.Errorf("rate table:\n%s\nwant 50 spawns in 2 s for per-job, - for daemon", text)
	}
}

// -spawn's medians are the other tables' (perf.Median): of an even count,
// the mean of the two middle values. It took the upper one, so -count 20
// gave a median no other mode's table would for the same timings.
func TestSpawnMedian(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	r := &spawnRow{setup: spawnSetup{1, "per-job", "pmirun", nil, nil},
		latency: map[int][]time.Duration{1: {ms(4), ms(1), ms(3), ms(2)}}, launch: map[int][]time.Duration{1: {ms(10), ms(20)}}}
	var out bytes.Buffer
	writeSpawnTables(&out, spawnOptions{sizes: []int{1}}, []*spawnRow{r})
	text := out.String()
	if !strings.Contains(text, "spawn ms (median)\t2.50 (1.00–4.00)") || !strings.Contains(text, "launch ms (median)\t15.00") {
		t.Errorf("table:\n%s\nwant spawn median 2.50 and launch median 15.00", text)
	}
}
