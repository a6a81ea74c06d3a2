package launch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/netio"
)

// agentProc is one node's agent as the root runs it: a bootstrap process
// (procAgent: pmid, ssh, srun, ip netns exec) or a node submitted to a
// running daemon (daemonAgent). The root starts it, waits for it on a
// goroutine of its own, and kills it if it lingers after the job.
type agentProc interface {
	// start starts the agent of node i (for slurm, the one process of
	// every node); its output goes to out.
	start(r *rootNode, i int, out *node.Output) error
	// wait blocks until the agent has ended and says how (nil: it ended
	// normally). It is called once, after a successful start.
	wait() error
	// kill ends the agent now, its ranks with it. It may be called
	// while wait runs, and on an agent never started (or whose start
	// failed), to release what agents made for it.
	kill()
}

// agents returns the agents of a job on hosts: bootstrap processes, or
// for daemon mode one submission per daemon, or for a spawned job of a
// run whose first job's agents host its jobs (multiRun.hostd) one
// submission to each of those on the job's nodes.
func (r *rootNode) agents(ctx context.Context, hosts []string) ([]agentProc, error) {
	if r.spec.Jobno > 0 && r.run.hostd != nil {
		addrs := make([]string, len(r.at))
		for i, n := range r.at {
			addrs[i] = r.run.hostd[n]
		}
		return dialDaemons(r.run.dtr, addrs), nil
	}
	if r.cfg.Bootstrap == "daemon" {
		tr, err := r.run.daemonTransport()
		if err != nil {
			return nil, err
		}
		return dialDaemons(tr, hosts), nil
	}
	cmds, err := r.cfg.agentCommands(ctx, hosts)
	if err != nil {
		return nil, err
	}
	r.step = r.cfg.Bootstrap == "slurm"
	as := make([]agentProc, len(cmds))
	for i, c := range cmds {
		as[i] = &procAgent{cmd: c}
	}
	return as, nil
}

// dialDaemons returns a daemonAgent for each address, connected to every
// one at once: one round of connection set-up and authentication however
// many nodes. A failure to connect is the agent's start's.
func dialDaemons(tr netio.Transport, addrs []string) []agentProc {
	as := make([]agentProc, len(addrs))
	var dials sync.WaitGroup
	for i, addr := range addrs {
		d := &daemonAgent{addr: addr}
		as[i] = d
		dials.Go(func() { d.dial(tr) })
	}
	dials.Wait()
	return as
}

// procAgent is an agent started as a process by a bootstrap, with the
// spec on its standard input.
type procAgent struct {
	cmd *exec.Cmd
	// guarded says the agent's process group is registered with
	// pmirun's guard (internal/guard) until wait has reaped it: if
	// pmirun is killed, the agent is, and its own guard kills its ranks.
	guarded bool
}

// start starts the bootstrap command with the spec on its stdin (then,
// for node 0, pmirun's own stdin for rank 0).
func (p *procAgent) start(r *rootNode, i int, out *node.Output) error {
	cmd := p.cmd
	spec := r.spec.Encode()
	var pumpTo *os.File // the stdin node's pipe, filled by pumpAgentStdin
	// srun's one process (r.step) feeds every node's agent its input
	// (--input=all), and the agent of the stdin node reads past the spec.
	stdinNode := i == r.spec.StdinNode() || r.step && r.spec.StdinNode() >= 0
	if stdinNode && r.cfg.Stdin != nil {
		// A pipe, not exec.Cmd's copier: waiting for the agent must not
		// wait for a read of pmirun's input (a terminal) that never ends.
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		defer pr.Close() // the agent has its copy
		cmd.Stdin, pumpTo = pr, pw
	} else {
		cmd.Stdin = bytes.NewReader(spec)
	}
	cmd.WaitDelay = time.Second
	so, err := out.Pipe(-1, false)
	if err != nil {
		return err
	}
	se, err := out.Pipe(-1, true)
	if err != nil {
		so.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = so, se
	cmd.SysProcAttr = sys.RankProcAttr()
	err = cmd.Start()
	if err == nil {
		p.guarded = guard.Add(cmd.Process.Pid)
	}
	so.Close()
	se.Close()
	if pumpTo != nil {
		if err != nil {
			pumpTo.Close()
		} else {
			go pumpAgentStdin(pumpTo, spec, r.cfg.Stdin)
		}
	}
	return err
}

// pumpAgentStdin writes the spec and then pmirun's input to the stdin
// node's agent. Like pumpStdin, it is not waited for: it may be blocked
// reading pmirun's input when the job ends, and ends at its next read.
func pumpAgentStdin(w *os.File, spec []byte, in io.Reader) {
	defer w.Close()
	if _, err := w.Write(spec); err != nil {
		return
	}
	_, _ = io.Copy(w, in)
}

func (p *procAgent) wait() error {
	err := p.cmd.Wait()
	if p.guarded {
		guard.Remove(p.cmd.Process.Pid)
	}
	return err
}

func (p *procAgent) kill() {
	if p.cmd.Process != nil {
		_ = sys.SignalGroup(p.cmd.Process.Pid, sys.SIGKILL)
	}
}

// daemonAgent is node i of the job submitted to the daemon at addr
// (pmid --daemon, or the agent hosting the run's jobs on that node):
// no process starts but the ranks. The submission
// connection carries the node's output and rank 0's input, and the
// daemon's Exit frame ends it; closing it ends the node.
type daemonAgent struct {
	addr    string
	dialErr error      // from dial: start fails with it
	c       netio.Conn // from dial; closed by kill, also before start
	r       *rootNode
	i       int
	so, se  io.WriteCloser
}

// submitTimeout bounds connecting and submitting to a daemon.
const submitTimeout = 10 * time.Second

// dial connects to the daemon (rootNode.agents, for every node at once).
func (d *daemonAgent) dial(tr netio.Transport) {
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	if d.c, d.dialErr = tr.Dial(ctx, d.addr); d.dialErr != nil {
		d.c = nil
	}
}

func (d *daemonAgent) start(r *rootNode, i int, out *node.Output) error {
	d.r, d.i = r, i
	if d.dialErr != nil {
		return fmt.Errorf("connect to daemon: %w", daemonDialErr(d.dialErr, r.cfg.SecretFile))
	}
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	c := d.c
	spec := *r.spec
	if r.cfg.Bootstrap == "daemon" && r.cfg.RootAddr == "" {
		// The daemon reaches pmirun where pmirun reached the daemon from
		// (a run's host dials the address its first job's agent did).
		host, _, _ := net.SplitHostPort(c.LocalAddr().String())
		_, port, _ := net.SplitHostPort(spec.Root)
		spec.Root = net.JoinHostPort(host, port)
	}
	if err := c.Send(ctx, netio.Frame{Type: daemon.FrameSubmit, Payload: node.Encode(daemon.Submit{Node: i, Spec: &spec})}); err != nil {
		return fmt.Errorf("submit to daemon: %w", err)
	}
	var err error
	if d.so, err = out.Pipe(-1, false); err != nil {
		return err
	}
	if d.se, err = out.Pipe(-1, true); err != nil {
		d.so.Close()
		return err
	}
	if i == r.spec.StdinNode() && r.cfg.Stdin != nil {
		// Like exec.Cmd's copier of a non-file Stdin, this goroutine is
		// not waited for: it may be blocked reading pmirun's input when
		// the job ends, and it ends at its next read or send.
		go pumpStdin(c, r.cfg.Stdin)
	}
	return nil
}

// pumpStdin sends in to the daemon as rank 0's input.
func pumpStdin(c netio.Conn, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if c.Send(context.Background(), netio.Frame{Type: daemon.FrameStdin, Payload: buf[:n]}) != nil {
				return
			}
		}
		if err != nil {
			_ = c.Send(context.Background(), netio.Frame{Type: daemon.FrameStdinEOF})
			return
		}
	}
}

func (d *daemonAgent) wait() error {
	defer d.se.Close()
	defer d.so.Close()
	defer d.c.Close()
	for {
		f, err := d.c.Recv(context.Background())
		if err != nil {
			return fmt.Errorf("connection to daemon %s lost: %w", d.addr, err)
		}
		switch f.Type {
		case daemon.FrameStdout:
			_, _ = d.so.Write(f.Payload)
		case daemon.FrameStderr:
			_, _ = d.se.Write(f.Payload)
		case daemon.FrameNotice:
			var n node.Ending
			_ = node.Decode(f.Payload, &n)
			select {
			case d.r.notices <- bootExit{d.i, fmt.Errorf("%s", n.Msg)}:
			default:
			}
		case daemon.FrameExit:
			var e daemon.Exit
			if err := node.Decode(f.Payload, &e); err != nil {
				return fmt.Errorf("daemon %s: %w", d.addr, err)
			}
			if e.Err != "" {
				return fmt.Errorf("%s", e.Err)
			}
			return nil
		default:
			return fmt.Errorf("daemon %s sent a frame of type %#x", d.addr, f.Type)
		}
	}
}

func (d *daemonAgent) kill() {
	if d.c != nil {
		d.c.Close()
	}
}
