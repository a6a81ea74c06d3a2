// Command shmflood is an e2e test rank that leaves its agent ever more
// requests to answer, as a buggy program that posts waiting gets (or
// non-blocking collectives) in a loop and never waits for them would:
//
//	shmflood -target R [-requests N]
//
// Rank R maps its node's segment (FASTPMI_SHM_FD) without the client,
// says hello on its request ring and pushes N (default 10,000) waiting
// gets of keys nobody puts, reading no response, then sleeps 60 s. The
// agent must end the job, naming rank R, once R has more requests waiting
// than it allows. Every other rank initialises through the Go client and
// sleeps, busy with something else than PMI, until it is ended.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/shm"
)

func main() {
	target := flag.Int("target", 1, "the rank that floods")
	requests := flag.Int("requests", 10000, "waiting gets to push")
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("PMI_RANK"))
	if rank != *target {
		c, err := client.Init()
		if err != nil {
			fmt.Fprintln(os.Stderr, "shmflood:", err)
			os.Exit(1)
		}
		_ = c
		time.Sleep(60 * time.Second)
		os.Exit(1)
	}
	f, err := os.OpenFile("/proc/self/fd/"+os.Getenv("FASTPMI_SHM_FD"), os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shmflood: open the segment:", err)
		os.Exit(1)
	}
	seg, err := shm.OpenFile(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shmflood: map the segment:", err)
		os.Exit(1)
	}
	local, _ := strconv.Atoi(os.Getenv("MPI_LOCALRANKID"))
	r := seg.Rank(local)
	if r == nil {
		fmt.Fprintln(os.Stderr, "shmflood: no local rank", local)
		os.Exit(1)
	}
	r.Announce()
	q := r.Requests()
	if err := q.PushWait(shm.Header{Op: shm.OpHello}, nil, 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "shmflood: hello:", err)
		os.Exit(1)
	}
	for i := range *requests {
		h := shm.Header{Op: shm.OpGet, Flags: shm.GetWait, Seq: uint32(i + 1)}
		if err := q.PushWait(h, shm.AppendInt32(nil, -1, "never-put-"+strconv.Itoa(i)), 10*time.Second); err != nil {
			// The agent stopped reading the ring: it has ended the job.
			break
		}
	}
	time.Sleep(60 * time.Second)
}
