package daemon

import (
	"context"
	"fmt"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
)

// QueryStatus asks the daemon at addr for its Status over tr (a transport
// made by NewTransport with the daemon's secret).
func QueryStatus(ctx context.Context, tr netio.Transport, addr string) (Status, error) {
	c, err := tr.Dial(ctx, addr)
	if err != nil {
		return Status{}, fmt.Errorf("query daemon status: %w", err)
	}
	defer c.Close()
	if err := c.Send(ctx, netio.Frame{Type: FrameStatus}); err != nil {
		return Status{}, fmt.Errorf("query daemon status: %w", err)
	}
	f, err := c.Recv(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("query daemon status: %w", err)
	}
	var st Status
	if f.Type != FrameStatus {
		return Status{}, fmt.Errorf("query daemon status: answer of frame type %#x", f.Type)
	}
	if err := node.Decode(f.Payload, &st); err != nil {
		return Status{}, fmt.Errorf("query daemon status: %w", err)
	}
	return st, nil
}
