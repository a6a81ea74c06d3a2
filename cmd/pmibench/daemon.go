package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Daemon mode (-daemon): pmibench starts K pmid --daemon on loopback and
// times the same job two ways, alternating: "loopback", pmirun starting
// per-job agents (--bootstrap loopback --nodes K), and "daemon", pmirun
// submitting it to the running daemons (--daemons). With fewer than K
// ranks both use N agents. The ratio column is loopback/daemon: how many
// times faster a job starts on running daemons.

// daemons are the pmid --daemon processes pmibench started.
type daemons struct {
	dir    string // holds the secret file
	secret string
	addrs  []string
	cmds   []*exec.Cmd
	waits  []chan error
}

// startDaemons starts k daemons, with extra arguments: the pmid next to
// pmirun, else the one in PATH. ctx bounds the start only: the daemons
// are ended by stop, with SIGTERM, however the benchmark ends (Ctrl-C
// too), so that they end their jobs as they do for any user.
func startDaemons(ctx context.Context, pmirun string, k int, stderr io.Writer, extra ...string) (*daemons, error) {
	pmid := filepath.Join(filepath.Dir(pmirun), "pmid")
	if _, err := os.Stat(pmid); err != nil {
		if pmid, err = exec.LookPath("pmid"); err != nil {
			return nil, fmt.Errorf("-daemon: no pmid next to %s or in PATH", pmirun)
		}
	}
	dir, err := os.MkdirTemp("", "pmibench-daemon-")
	if err != nil {
		return nil, fmt.Errorf("-daemon: %w", err)
	}
	d := &daemons{dir: dir, secret: filepath.Join(dir, "secret")}
	rx := regexp.MustCompile(`daemon listening on (\S+) `)
	for i := range k {
		cmd := exec.Command(pmid, append([]string{"--daemon", "--listen", "127.0.0.1:0", "--secret-file", d.secret}, extra...)...)
		cmd.Stderr = stderr
		cmd.SysProcAttr = sys.RankProcAttr() // it dies with pmibench
		out, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			d.stop(stderr)
			return nil, fmt.Errorf("-daemon: start %s: %w", pmid, err)
		}
		d.cmds = append(d.cmds, cmd)
		lines := make(chan string, 1)
		wait := make(chan error, 1)
		d.waits = append(d.waits, wait)
		go func() { // ends when the daemon does; stop waits for it
			br := bufio.NewReader(out)
			l, _ := br.ReadString('\n')
			lines <- l
			io.Copy(io.Discard, br)
			wait <- cmd.Wait()
		}()
		var m []string
		select {
		case l := <-lines:
			m = rx.FindStringSubmatch(l)
		case <-ctx.Done():
			d.stop(stderr)
			return nil, fmt.Errorf("-daemon: %w", ctx.Err())
		case <-time.After(10 * time.Second):
		}
		if m == nil {
			d.stop(stderr)
			return nil, fmt.Errorf("-daemon: daemon %d did not say where it listens", i)
		}
		d.addrs = append(d.addrs, m[1])
	}
	fmt.Fprintf(stderr, "pmibench: %d daemons at %s\n", k, strings.Join(d.addrs, ","))
	return d, nil
}

// launchers are the two ways of running a job of n ranks.
func (d *daemons) launchers(pmirun string) []Launcher {
	k := len(d.addrs)
	return []Launcher{
		{Name: "loopback", Path: pmirun, Args: []string{"--bootstrap", "loopback"}, NodeArgs: func(n int) []string {
			return []string{"--nodes", strconv.Itoa(min(k, n))}
		}},
		{Name: "daemon", Path: pmirun, Args: []string{"--secret-file", d.secret}, NodeArgs: func(n int) []string {
			return []string{"--daemons", strings.Join(d.addrs[:min(k, n)], ",")}
		}},
	}
}

// stop ends the daemons with SIGTERM and waits for them.
func (d *daemons) stop(stderr io.Writer) {
	for i, cmd := range d.cmds {
		_ = cmd.Process.Signal(sys.SIGTERM)
		select {
		case err := <-d.waits[i]:
			if err != nil {
				fmt.Fprintf(stderr, "pmibench: daemon %d: %v\n", i, err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-d.waits[i]
		}
	}
	os.RemoveAll(d.dir)
}
