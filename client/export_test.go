package client

// NewPlayed is newPlayed for the external tests: a rank played by a
// goroutine over a segment the test holds.
var NewPlayed = newPlayed

// Held is how many collectives c still holds anything of (a request, a
// result, a copy), for the tests that check that this stays bounded.
func Held(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch t := c.t.(type) {
	case *textTransport:
		return len(t.colls)
	case *shmTransport:
		return len(t.unread) + len(t.kept)
	case *singleton:
		return len(t.results)
	}
	return 0
}

// ForgetLauncher lets the next Init take the launcher's variables again,
// for the tests that call Init in the test process itself.
func ForgetLauncher() { launcherTaken.Store(false) }
