// Command spawnprog is an e2e test rank for the Go client's Spawn and
// SpawnMultiple:
//
//	spawnprog [-n N] [-multi]
//
// The parent job's rank 0 spawns N copies of itself (with -multi: N
// copies as command 0 and one more as command 1, in one SpawnMultiple),
// with the pre-put key PARENT = "from-<parent job id>", after two spawns
// that must be refused (an empty info key, a NUL byte in an argument).
// Every child checks
// what it was given — Spawned, its size, Appnum by command, the pre-put
// key readable before any fence, a job id of its own — exchanges a key
// with the other children through its own KVS, and publishes
// spawnprog-<rank> = "<appnum>:<parent value>", which the parent looks
// up. Every rank prints one line ("parent ok ..." or "child ok ...");
// any mismatch goes to stderr and exits 1.
//
//	spawnprog -storm K [-hold D]
//
// instead has the parent's rank 0 spawn K one-process jobs one after the
// other, each child doing PMI init and finalize only, and print "storm ok
// K" once every spawn call returned; then it waits D before it finalizes
// (a test counts the launcher's resources meanwhile).
//
//	spawnprog -serve NAME | -connect NAME
//
// are two jobs launched separately that meet by name, as an
// MPI_Comm_accept server and an MPI_Comm_connect client do: the server's
// rank 0 publishes NAME = "port-of-<job id>" and waits until the client
// has published NAME-ack, then withdraws NAME; the client's rank 0 looks
// NAME up (retrying until it appears), publishes NAME-ack = what it
// found and stays until NAME is withdrawn (its run's names leave with
// it). They print "serve ok" and "connect ok <port>".
//
//	spawnprog -appnum ARG
//
// is a rank of an MPMD job: it puts its appnum under app-<rank>, fences,
// reads every rank's and prints "appnum rank R size S appnum A arg ARG
// apps a0,a1,..." (as tests/cprog/pmi2_appnum.c does, so they mix).
//
//	spawnprog -where
//
// has the parent's rank 0 spawn one child that prints "child under pid
// P", P the process that started it (its agent), and waits for it.
//
//	spawnprog -nest D
//
// has rank 0 of the parent job spawn one copy of itself with -nest D-1,
// which does the same, down to -nest 0: a chain of D spawned jobs, each
// spawned by the one before. Every rank prints "nest D job JOBID". With
// -late, a spawned job's rank 0 spawns only once its spawner's rank 0
// (process -pid, which the spawner passes down) has exited, and retries
// a refused spawn for up to 10 s: the spawner's processes then no longer
// count against the universe size. With -bare, it spawns itself by its
// file name alone, which the ranks' PATH must find.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

func main() {
	n := flag.Int("n", 2, "children of the first command")
	multi := flag.Bool("multi", false, "spawn two commands at once")
	storm := flag.Int("storm", 0, "spawn this many one-process jobs in a row")
	hold := flag.Duration("hold", 0, "with -storm: wait this long after the storm")
	serve := flag.String("serve", "", "publish this name and wait for its -ack")
	connect := flag.String("connect", "", "look this name up and publish its -ack")
	where := flag.Bool("where", false, "spawn one child that says which agent started it")
	appnum := flag.String("appnum", "", "an MPMD rank: print every rank's appnum")
	nest := flag.Int("nest", -1, "spawn a chain of this many jobs, each by the one before")
	late := flag.Bool("late", false, "with -nest: spawn once the spawner's rank 0 has exited")
	pid := flag.Int("pid", 0, "with -late: the spawner's rank 0")
	bare := flag.Bool("bare", false, "with -nest: spawn this program by its file name, looked up on PATH")
	flag.Parse()
	var err error
	switch {
	case *nest >= 0:
		err = nestTest(*nest, *late, *pid, *bare)
	case *appnum != "":
		err = appnums(*appnum)
	case *where:
		err = whereTest()
	case *serve != "" || *connect != "":
		err = meet(*serve, *connect)
	default:
		err = run(*n, *multi, *storm, *hold)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "spawnprog: %v\n", err)
		os.Exit(1)
	}
}

// meet is -serve or -connect.
func meet(serve, connect string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	if c.Rank() == 0 {
		if serve != "" {
			if err := c.Publish(ctx, serve, "port-of-"+c.Info().JobID); err != nil {
				return err
			}
			if _, err := lookupWait(ctx, c, serve+"-ack"); err != nil {
				return err
			}
			if err := c.Unpublish(ctx, serve); err != nil {
				return err
			}
			fmt.Println("serve ok")
		} else {
			port, err := lookupWait(ctx, c, connect)
			if err != nil {
				return err
			}
			if err := c.Publish(ctx, connect+"-ack", port); err != nil {
				return err
			}
			// Stay until the server has seen the ack (it then withdraws
			// its name): this run's names leave with it.
			for {
				if _, err := c.Lookup(ctx, connect); errors.Is(err, client.ErrNotFound) {
					break
				} else if ctx.Err() != nil {
					return fmt.Errorf("the server never withdrew %s", connect)
				}
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Println("connect ok", port)
		}
	}
	return c.Finalize()
}

// appnums is -appnum.
func appnums(arg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	info := c.Info()
	if err := c.Put("app-"+strconv.Itoa(info.Rank), []byte(strconv.Itoa(info.Appnum)), client.HintNone); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	apps := make([]string, info.Size)
	for r := range apps {
		v, err := c.Get(ctx, "app-"+strconv.Itoa(r), client.FromRank(r))
		if err != nil {
			return err
		}
		apps[r] = string(v)
	}
	fmt.Printf("appnum rank %d size %d appnum %d arg %s apps %s\n", info.Rank, info.Size, info.Appnum, arg, strings.Join(apps, ","))
	return c.Finalize()
}

// whereTest is -where.
func whereTest() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	switch {
	case c.Info().Spawned:
		node := strconv.Itoa(os.Getppid())
		fmt.Println("child under pid", node)
		if err := c.Publish(ctx, "where-"+c.Info().JobID, node); err != nil {
			return err
		}
	case c.Rank() == 0:
		id, err := c.Spawn(ctx, client.SpawnCmd{Prog: os.Args[0], Args: os.Args[1:], Procs: 1}, nil)
		if err != nil {
			return err
		}
		if _, err := lookupWait(ctx, c, "where-"+id); err != nil {
			return err
		}
	}
	return c.Finalize()
}

// nestTest is -nest.
func nestTest(depth int, late bool, spawner int, bare bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	fmt.Printf("nest %d job %s\n", depth, c.Info().JobID)
	if depth > 0 && c.Rank() == 0 {
		args := []string{"-nest", strconv.Itoa(depth - 1)}
		if late {
			args = append(args, "-late", "-pid", strconv.Itoa(os.Getpid()))
			for spawner > 0 && ctx.Err() == nil {
				if _, err := os.Stat("/proc/" + strconv.Itoa(spawner)); err != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		prog := os.Args[0]
		if bare {
			prog = filepath.Base(prog)
			args = append(args, "-bare")
		}
		cmd := client.SpawnCmd{Prog: prog, Args: args, Procs: 1}
		_, err := c.Spawn(ctx, cmd, nil)
		for end := time.Now().Add(10 * time.Second); late && err != nil && time.Now().Before(end); {
			time.Sleep(100 * time.Millisecond)
			_, err = c.Spawn(ctx, cmd, nil)
		}
		if err != nil {
			return err
		}
	}
	return c.Finalize()
}

// lookupWait looks name up until it is published.
func lookupWait(ctx context.Context, c *client.Client, name string) (string, error) {
	for {
		port, err := c.Lookup(ctx, name)
		if err == nil {
			return port, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("lookup %s: %v", name, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func run(n int, multi bool, storm int, hold time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	info := c.Info()
	switch {
	case info.Spawned && storm > 0:
		// A storm child: init and finalize only.
	case info.Spawned:
		err = child(ctx, c, n, multi)
	case storm > 0:
		if info.Rank == 0 {
			for i := 0; i < storm && err == nil; i++ {
				_, err = c.Spawn(ctx, client.SpawnCmd{Prog: os.Args[0], Args: os.Args[1:], Procs: 1}, nil)
			}
			if err == nil {
				fmt.Printf("storm ok %d\n", storm)
				time.Sleep(hold)
			}
		}
	default:
		err = parent(ctx, c, n, multi)
	}
	if err != nil {
		return err
	}
	return c.Finalize()
}

func parent(ctx context.Context, c *client.Client, n int, multi bool) error {
	info := c.Info()
	if info.Rank != 0 {
		fmt.Printf("parent ok rank %d\n", info.Rank)
		return nil
	}
	// A request the launcher cannot read (an empty info key) is refused,
	// and the parent goes on.
	bad := client.SpawnCmd{Prog: os.Args[0], Procs: 1, Info: map[string]string{"": "x"}}
	if _, err := c.Spawn(ctx, bad, nil); err == nil {
		return errors.New("a spawn with an empty info key succeeded")
	}
	// So is one no program can be started with (a NUL byte in an
	// argument): it ended the whole run ('fork/exec: invalid argument').
	nul := client.SpawnCmd{Prog: os.Args[0], Args: []string{"a\x00b"}, Procs: 1}
	if _, err := c.Spawn(ctx, nul, nil); err == nil {
		return errors.New("a spawn with a NUL byte in an argument succeeded")
	}
	pre := map[string]string{"PARENT": "from-" + info.JobID}
	cmd := client.SpawnCmd{Prog: os.Args[0], Args: os.Args[1:], Procs: n}
	cmds := []client.SpawnCmd{cmd}
	if multi {
		cmds = append(cmds, client.SpawnCmd{Prog: os.Args[0], Args: os.Args[1:], Procs: 1, Info: map[string]string{"wdir": "/"}})
	}
	id, err := c.SpawnMultiple(ctx, cmds, pre)
	if err != nil {
		return err
	}
	if id == "" || id == info.JobID {
		return fmt.Errorf("spawned job id %q (own %q)", id, info.JobID)
	}
	total := n
	if multi {
		total++
	}
	for r := 0; r < total; r++ {
		name := "spawnprog-" + strconv.Itoa(r)
		var port string
		for {
			if port, err = c.Lookup(ctx, name); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("lookup %s: %v", name, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		app := 0
		if r >= n {
			app = 1
		}
		if want := strconv.Itoa(app) + ":" + pre["PARENT"]; port != want {
			return fmt.Errorf("%s = %q, want %q", name, port, want)
		}
	}
	fmt.Printf("parent ok rank 0 children %d over %s\n", total, info.Transport)
	return nil
}

func child(ctx context.Context, c *client.Client, n int, multi bool) error {
	info := c.Info()
	total := n
	if multi {
		total++
	}
	app := 0
	if info.Rank >= n {
		app = 1
	}
	if info.Size != total || info.Appnum != app {
		return fmt.Errorf("child rank %d: size %d appnum %d, want %d and %d", info.Rank, info.Size, info.Appnum, total, app)
	}
	if app == 1 {
		if wd, _ := os.Getwd(); wd != "/" {
			return fmt.Errorf("child rank %d started in %s, want / (info wdir)", info.Rank, wd)
		}
	}
	parent, err := c.Get(ctx, "PARENT")
	if err != nil || len(parent) < 5 || string(parent[5:]) == info.JobID {
		return fmt.Errorf("child rank %d: pre-put PARENT = %q (%v), own job %s", info.Rank, parent, err, info.JobID)
	}
	if err := c.Put("k"+strconv.Itoa(info.Rank), []byte("v"+strconv.Itoa(info.Rank)), client.HintNone); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	for r := 0; r < total; r++ {
		v, err := c.Get(ctx, "k"+strconv.Itoa(r), client.FromRank(r))
		if err != nil || string(v) != "v"+strconv.Itoa(r) {
			return fmt.Errorf("child rank %d: key of rank %d = %q (%v)", info.Rank, r, v, err)
		}
	}
	if err := c.Publish(ctx, "spawnprog-"+strconv.Itoa(info.Rank), strconv.Itoa(app)+":"+string(parent)); err != nil {
		return err
	}
	fmt.Printf("child ok rank %d size %d appnum %d over %s\n", info.Rank, info.Size, info.Appnum, info.Transport)
	return nil
}
