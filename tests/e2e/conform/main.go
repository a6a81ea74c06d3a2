// Command conform is the Go client's run of the scenario of
// tests/cprog/fastpmi_scenario.c: the same steps, through package client,
// printing the same canonical lines, so that the conformance test can
// compare what the Go client and libfastpmi get from the same agent.
// Arguments as the C program's: noring, nowait, withspawn, abort (rank 0
// aborts with code 1). A failed call prints to stderr and exits 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

var me = -1

func check(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "conform: rank %d: %s failed: %v\n", me, what, err)
		os.Exit(1)
	}
}

func line(step string, vals []string) {
	fmt.Printf("r=%d %s %s\n", me, step, strings.Join(vals, ","))
}

func values(v client.Values) []string {
	out := make([]string, v.Len())
	for i := range out {
		out[i] = string(v.At(i))
	}
	return out
}

func main() {
	ctx := context.Background()
	c, err := client.Init()
	check(err, "init")
	me = c.Rank()
	size := c.Size()
	fmt.Printf("r=%d init size=%d transport=%s\n", me, size, c.Info().Transport)
	noring, nowait, withspawn := false, false, false
	for _, a := range os.Args[1:] {
		switch a {
		case "abort":
			if me == 0 {
				check(c.Abort(1, "scenario abort"), "abort")
				os.Exit(1)
			}
			time.Sleep(30 * time.Second)
			os.Exit(2)
		case "namecap":
			// Rank 0 publishes names until one is refused (at most
			// 10,000), then looks up the first: the job goes on.
			if me == 0 {
				n := 0
				var refused error
				for ; n < 10000; n++ {
					if refused = c.Publish(ctx, fmt.Sprintf("cap-%d", n), "port"); refused != nil {
						break
					}
				}
				p, err := c.Lookup(ctx, "cap-0")
				fmt.Printf("r=0 namecap published=%d refused=%v\nr=0 namecap lookup=%s err=%v\n", n, refused, p, err)
			}
			check(c.Fence(ctx), "fence")
			check(c.Finalize(), "finalize")
			os.Exit(0)
		case "noring":
			noring = true
		case "nowait":
			nowait = true
		case "withspawn":
			withspawn = true
		}
	}

	getAll := func(step, prefix string, wait bool) {
		vals := make([]string, size)
		for r := range vals {
			opts := []client.GetOption{client.FromRank(r)}
			if wait {
				opts = append(opts, client.WaitForPut())
			}
			v, err := c.Get(ctx, fmt.Sprintf("%s-%d", prefix, r), opts...)
			check(err, "get")
			vals[r] = string(v)
		}
		line(step, vals)
	}

	check(c.Put(fmt.Sprintf("k-%d", me), []byte(fmt.Sprintf("v-%d;x=y", me)), client.HintNone), "put")
	check(c.Fence(ctx), "fence")
	getAll("get", "k", false)

	v, err := c.Allgather(ctx, []byte(fmt.Sprintf("ag-%d", me)))
	check(err, "allgather")
	line("allgather", values(v))
	v, err = c.Allgather(ctx, []byte(fmt.Sprintf("zc-%d", me)))
	check(err, "allgather")
	line("view", values(v))

	check(c.Put(fmt.Sprintf("f-%d", me), []byte(fmt.Sprintf("fv-%d", me)), client.Dense), "put")
	fence := c.Ifence()
	ag := c.Iallgather([]byte(fmt.Sprintf("iag-%d", me)))
	check(ag.Wait(ctx), "wait iallgather")
	check(fence.Wait(ctx), "wait ifence")
	line("iallgather", values(ag.Values()))
	getAll("ifence-get", "f", false)

	iv := c.Iallgather([]byte(fmt.Sprintf("iv-%d", me)))
	f2 := c.Ifence()
	check(f2.Wait(ctx), "wait ifence")
	check(iv.Wait(ctx), "wait iallgather")
	line("iview", values(iv.Values()))

	check(c.Put(fmt.Sprintf("w-%d", me), []byte(fmt.Sprintf("wv-%d", me)), client.Sparse), "put")
	if !nowait {
		nx := (me + 1) % size
		w, err := c.Get(ctx, fmt.Sprintf("w-%d", nx), client.FromRank(nx), client.WaitForPut())
		check(err, "get with wait")
		fmt.Printf("r=%d getwait %s\n", me, w)
	}

	if !noring {
		rr, err := c.Ring(ctx, []byte(fmt.Sprintf("ring-%d", me)))
		check(err, "ring")
		fmt.Printf("r=%d ring pos=%d size=%d left=%s right=%s\n", me, rr.Rank, rr.Size, rr.Left, rr.Right)
	}

	m, found, err := c.JobAttr(ctx, "PMI_process_mapping")
	check(err, "job attribute")
	fmt.Printf("r=%d mapping found=%d %s\n", me, b2i(found), m)

	check(c.PutNodeAttr(ctx, "na", "node-shared"), "put node attribute")
	check(c.Fence(ctx), "fence")
	na, naFound, err := c.NodeAttr(ctx, "na", true)
	check(err, "node attribute")
	_, missFound, err := c.NodeAttr(ctx, "na-missing", false)
	check(err, "node attribute")
	fmt.Printf("r=%d nodeattr found=%d %s missing=%d\n", me, b2i(naFound), na, b2i(missFound))

	if me == 0 {
		check(c.Publish(ctx, "scenario-svc", "port-0"), "publish")
	}
	check(c.Fence(ctx), "fence")
	p, err := c.Lookup(ctx, "scenario-svc")
	fmt.Printf("r=%d lookup rc=%d %s\n", me, b2i(err != nil), p)
	check(c.Fence(ctx), "fence")
	if me == 0 {
		check(c.Unpublish(ctx, "scenario-svc"), "unpublish")
	}
	check(c.Fence(ctx), "fence")
	_, err = c.Lookup(ctx, "scenario-svc")
	fmt.Printf("r=%d lookup-after-unpublish found=%d\n", me, b2i(err == nil))

	_, err = c.Get(ctx, "no-such-key")
	if err != nil && !errors.Is(err, client.ErrNotFound) {
		check(err, "get of a missing key")
	}
	fmt.Printf("r=%d missing found=%d\n", me, b2i(err == nil))

	if withspawn && me == 0 {
		job, err := c.Spawn(ctx, client.SpawnCmd{Prog: "/bin/true", Procs: 2}, nil)
		rc := 0
		if err != nil {
			rc = 1
		}
		fmt.Printf("r=%d spawn rc=%d job=%s\n", me, rc, job[strings.LastIndexByte(job, '-')+1:])
	}
	check(c.Finalize(), "finalize")
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
