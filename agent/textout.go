package agent

import (
	"fmt"
	"net"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// The text front end's output. No goroutine ever blocks on another rank's
// socket: a reply to a connection's own request, made by the connection's
// reader in its own turn, is written by that reader when nothing is queued
// before it (a rank that stops reading then stalls only its own reader,
// which stops reading its requests: back-pressure on that rank alone);
// every other reply — a collective another rank completed, an Upstream
// completion, a waiting get another rank's put released — is queued on
// the connection and written by its writer goroutine. The queue is
// bounded (Config.ReplyQueueBytes): a rank whose queue overflows has
// stopped reading; it is reported as a protocol error naming it and its
// connection is closed, which the launcher turns into the job's failure.

// defaultReplyQueueBytes is the reply queue bound for a job of size ranks:
// 4 MiB, or two full allgather replies if those are larger (a queued
// reply is never refused because one large reply is being written).
func defaultReplyQueueBytes(size int) int {
	return max(4<<20, 2*size*(pmiwire.ValLenMax+32))
}

// closeFlush bounds how long Close spends delivering the shutdown errors
// and queued replies to ranks before it closes their connections.
const closeFlush = 100 * time.Millisecond

// waitFlushed waits until c's queue is written, or deadline.
func (c *textConn) waitFlushed(deadline time.Time) {
	for {
		c.omu.Lock()
		idle := c.out.failed || (!c.out.writing && len(c.out.queue) == 0)
		c.omu.Unlock()
		if idle || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// protocolErrorWriteTimeout bounds the last reply to a connection whose
// framing is lost: its rank may not be reading.
const protocolErrorWriteTimeout = 100 * time.Millisecond

// textOutput is one connection's reply queue. Fields are guarded by
// textConn.omu.
type textOutput struct {
	queue   net.Buffers // replies waiting, in order
	queued  int         // bytes in queue and in the batch being written
	writing bool        // the reader (inline) or the writer is writing to nc
	failed  bool        // the queue overflowed or a write failed: replies are dropped
}

// write writes b, a reply made by the connection's own reader: at once if
// nothing is queued or being written, else after what is (queue).
func (c *textConn) write(b []byte) {
	c.omu.Lock()
	if c.out.failed {
		c.omu.Unlock()
		return
	}
	if c.out.writing || len(c.out.queue) > 0 {
		c.omu.Unlock()
		c.queue(b)
		return
	}
	c.out.writing = true
	c.omu.Unlock()
	_, err := c.nc.Write(b)
	c.omu.Lock()
	c.out.writing = false
	more := len(c.out.queue) > 0
	if err != nil {
		c.out.failed = true
	}
	c.omu.Unlock()
	if err != nil {
		c.a.log.Debug("write PMI reply", "rank", c.rankNum(), "err", err)
	}
	if more {
		c.kick()
	}
}

// queue appends b to the connection's queue for its writer; any goroutine
// may call it. Overflow fails the connection's rank.
func (c *textConn) queue(b []byte) {
	c.omu.Lock()
	if c.out.failed {
		c.omu.Unlock()
		return
	}
	if c.out.queued > 0 && c.out.queued+len(b) > c.a.replyQueueBytes {
		c.out.failed = true
		n := c.out.queued
		c.out.queue, c.out.queued = nil, 0
		c.omu.Unlock()
		c.overflow(n, len(b))
		return
	}
	c.out.queue = append(c.out.queue, b)
	c.out.queued += len(b)
	c.omu.Unlock()
	c.kick()
}

func (c *textConn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// overflow fails the rank whose replies no longer fit its queue.
func (c *textConn) overflow(queued, next int) {
	err := fmt.Errorf("stopped reading its PMI replies (%d bytes queued, %d more refused; limit %d)",
		queued, next, c.a.replyQueueBytes)
	c.a.log.Info("PMI replies not read; closing connection", "rank", c.rankNum(), "err", err)
	c.a.protocolError(c.rankNum(), err)
	c.nc.Close() // the reader sees the end and reports the connection closed
}

// writeLoop is the connection's writer goroutine: it writes queued replies
// in batches until the connection has ended (done).
func (c *textConn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		for {
			c.omu.Lock()
			if c.out.writing || c.out.failed || len(c.out.queue) == 0 {
				// An inline writer kicks again when it is done.
				c.omu.Unlock()
				break
			}
			batch := c.out.queue
			c.out.queue = nil
			c.out.writing = true
			c.omu.Unlock()
			n, err := batch.WriteTo(c.nc)
			c.omu.Lock()
			c.out.writing = false
			c.out.queued -= int(n)
			if err != nil {
				c.out.failed = true
				c.out.queue, c.out.queued = nil, 0
			}
			c.omu.Unlock()
			if err != nil {
				c.a.log.Debug("write PMI reply", "rank", c.rankNum(), "err", err)
				break
			}
		}
	}
}

// writeLast writes b, the last reply before the connection is closed for
// a protocol error, within protocolErrorWriteTimeout.
func (c *textConn) writeLast(b []byte) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(protocolErrorWriteTimeout))
	c.write(b)
}
