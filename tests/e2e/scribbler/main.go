// Command scribbler is an e2e test rank that damages its node's shared
// segment, as a buggy application with a stray pointer would:
//
//	scribbler -target R -seed S -stores N [-region NAME]
//
// Every rank initialises PMI through the Go client (shared memory), puts
// a key and enters a loop of fences, allgathers and gets. Rank R, after
// its first fence, maps the segment a second time (FASTPMI_SHM_FD) and
// makes N random single-byte stores into it — in the region NAME (header,
// lines: the doorbell and epoch lines, ctrl: the control blocks, rings,
// data: slots, results and KVS) or anywhere — then goes on with the loop
// for a few rounds and exits 0 without PMI finalize. The job must end
// with a failure either way: that exit, or what the agent makes of the
// damage. Region sleepers instead stores 0 into the agent-sleepers word
// once. Any rank that sees an error from the client prints it and
// exits 1.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/shm"
)

func main() {
	target := flag.Int("target", 1, "the rank that scribbles")
	seed := flag.Uint64("seed", 1, "random seed")
	stores := flag.Int("stores", 64, "stores to make")
	region := flag.String("region", "any", "header, lines, ctrl, rings, data or any")
	flag.Parse()
	// The client closes the inherited descriptor once it has mapped the
	// segment: open the memfd again first.
	segFile, err := os.OpenFile("/proc/self/fd/"+os.Getenv("FASTPMI_SHM_FD"), os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scribbler: open the segment:", err)
		os.Exit(1)
	}
	c, err := client.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scribbler:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	me := c.Rank()
	check := func(what string, err error) {
		if err != nil {
			fmt.Fprintf(os.Stderr, "scribbler: rank %d: %s: %v\n", me, what, err)
			os.Exit(1)
		}
	}
	check("put", c.Put("k"+strconv.Itoa(me), []byte("value of "+strconv.Itoa(me)), client.HintNone))
	for round := range 20 {
		check("fence", c.Fence(ctx))
		if me == *target && round == 0 {
			scribble(segFile, *seed, *stores, *region)
		}
		if me == *target && round == 5 {
			os.Exit(0) // without finalize
		}
		_, err := c.Allgather(ctx, []byte(fmt.Sprintf("r%d-%d", me, round)))
		check("allgather", err)
		_, err = c.Get(ctx, "k"+strconv.Itoa((me+1)%c.Size()))
		check("get", err)
	}
	check("finalize", c.Finalize())
}

// scribble makes n random stores into the segment.
func scribble(f *os.File, seed uint64, n int, region string) {
	seg, err := shm.OpenFile(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scribbler: map segment:", err)
		os.Exit(1)
	}
	mem := seg.Bytes()
	// Region bounds from the header's offsets (shm/layout.go): control
	// blocks and the ready bitmap, ring data, then slots, results, KVS.
	le := binary.LittleEndian
	ctrl, rings, slots := int(le.Uint64(mem[56:])), int(le.Uint64(mem[64:])), int(le.Uint64(mem[72:]))
	lo, hi := 0, len(mem)
	switch region {
	case "header":
		lo, hi = 0, 128
	case "lines":
		lo, hi = 128, 4096
	case "ctrl":
		lo, hi = ctrl, rings
	case "rings":
		lo, hi = rings, slots
	case "data":
		lo = slots
	case "sleepers":
		// The agent-sleepers word (shm/layout.go offAgentSleepers): ranks
		// ring the doorbell only while it says the agent sleeps.
		binary.NativeEndian.PutUint32(mem[132:], 0)
		return
	}
	hi = min(hi, len(mem))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for range n {
		mem[lo+r.IntN(hi-lo)] = byte(r.Uint32())
	}
}
