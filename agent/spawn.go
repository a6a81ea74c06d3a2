package agent

import "errors"

// Spawn starts a new job: the launcher places and starts the children,
// so a spawn request is a deferred call like a name request (names.go).
// The core checks nothing of the request beyond its framing (the front
// end parsed it): what is possible — programs, hosts, room in the
// universe — only the launcher knows. The rank is answered with the new
// job's id, or with the launcher's reason when no child started.

// spawn starts a spawn request; the rank is answered at SpawnDone.
func (c *Core) spawn(o Spawn) {
	t := to{o.Local, o.Req, ReplySpawn}
	if c.closed {
		c.reply(t, Reply{Err: errors.New("agent shutting down")})
		return
	}
	c.up(UpCall{Kind: UpSpawn, ID: c.newCall(t), Spawn: o.Spawn, Owner: c.ranks[o.Local].global})
}

// spawnDone answers the rank of spawn call o.ID, if it still waits.
func (c *Core) spawnDone(o SpawnDone) {
	t, waiting := c.takeCall(o.ID)
	if !waiting {
		return // answered by Shutdown
	}
	c.reply(t, Reply{Err: o.Err, Val: o.JobID, Found: o.Err == nil})
}
