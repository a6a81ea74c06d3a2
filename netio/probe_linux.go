//go:build linux

package netio

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/pawelgaczynski/giouring"
)

// probeUring answers, once per process, whether the io_uring backend can
// run here, and why (or why not).
var probeUring = sync.OnceValues(func() (bool, string) {
	err := probeUringOnce()
	if err != nil {
		return false, err.Error()
	}
	v := "unknown kernel"
	if k, kerr := giouring.GetKernelVersion(); kerr == nil {
		v = fmt.Sprintf("kernel %d.%d.%d", k.Kernel, k.Major, k.Minor) // giouring: Kernel.Major.Minor
	}
	return true, "io_uring probe passed: setup, buffer ring and multishot recv work (" + v + ")"
})

// uringOps are the opcodes the backend submits.
var uringOps = []struct {
	op   uint8
	name string
}{
	{giouring.OpAccept, "accept"},
	{giouring.OpRecv, "recv"},
	{giouring.OpSend, "send"},
	{giouring.OpRead, "read"},
	{giouring.OpAsyncCancel, "async_cancel"},
}

// probeBufs are the probe's provided buffers. They live for the process:
// the kernel may touch them until the probe ring's teardown completes,
// which is asynchronous.
var probeBufs [2 * 64]byte

func probeUringOnce() error {
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil {
		switch strings.TrimSpace(string(b)) {
		case "2":
			return errors.New("kernel.io_uring_disabled=2")
		case "1":
			// Only members of kernel.io_uring_group may: setup tells.
		}
	}
	ring := giouring.NewRing()
	if err := ring.QueueInit(8, 0); err != nil {
		return fmt.Errorf("io_uring_setup: %w (seccomp profile, io_uring_disabled or old kernel)", err)
	}
	defer ring.QueueExit()
	probe, err := ring.GetProbeRing()
	if err != nil {
		return fmt.Errorf("probe io_uring opcodes: %w", err)
	}
	for _, o := range uringOps {
		if !probe.IsSupported(o.op) {
			return fmt.Errorf("io_uring opcode %s unsupported", o.name)
		}
	}
	// The backend waits for completions through Go's poller.
	w, err := sys.NewNetPollWatcher(ring.RingFd(), "netio-probe")
	if err != nil {
		return err
	}
	w.Close()
	br, err := ring.SetupBufRing(2, 0, 0)
	if err != nil {
		return fmt.Errorf("register provided buffer ring: %w (kernel before 5.19?)", err)
	}
	defer func() {
		if err := ring.FreeBufRing(0); err == nil {
			sys.NetBufRingFree(br, 2)
		}
	}()
	buf := probeBufs[:]
	for i := range 2 {
		br.BufRingAdd(sys.BufAddr(buf[i*64:]), 64, uint16(i), giouring.BufRingMask(2), i)
	}
	br.BufRingAdvance(2)

	a, b, err := sys.Socketpair("netio-probe")
	if err != nil {
		return fmt.Errorf("probe multishot recv: %w", err)
	}
	defer a.Close()
	defer b.Close()
	sqe := ring.GetSQE()
	*sqe = giouring.SubmissionQueueEntry{}
	sqe.PrepareRecvMultishot(int(a.Fd()), 0, 0, 0)
	sqe.Flags |= giouring.SqeBufferSelect
	sqe.BufIG = 0
	sqe.UserData = 1
	if _, err := b.Write([]byte("x")); err != nil {
		return fmt.Errorf("probe multishot recv: %w", err)
	}
	var res int32
	var flags uint32
	for {
		_, err := ring.SubmitAndWait(1)
		if sys.NetIsErrno(err, sys.NetEINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("probe multishot recv: submit: %w", err)
		}
		cqe, err := ring.PeekCQE()
		if err != nil || cqe == nil {
			continue
		}
		res, flags = cqe.Res, cqe.Flags
		ring.CQESeen(cqe)
		break
	}
	if res < 0 {
		return fmt.Errorf("probe multishot recv: %w", sys.NetErrno(res))
	}
	if res != 1 || flags&giouring.CQEFMore == 0 || flags&giouring.CQEFBuffer == 0 {
		return fmt.Errorf("multishot recv with provided buffers unsupported (res %d, flags %#x; kernel before 6.0?)", res, flags)
	}
	return nil
}
