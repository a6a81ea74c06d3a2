package agent

// Late job attributes: values the agent's owner supplies after the agent
// started (Config.LateAttrs, Agent.SetJobAttr), such as the node's
// topology file (PMI_hwloc_xmlfile), made once per node when a rank first
// asks for it (Ready.Wants), so jobs whose ranks never ask pay nothing. A read of one before its value is set waits for it, outside the
// parked gets that checkStuck judges: the owner guarantees a value
// (or "unavailable") in bounded time, and Shutdown fails the waiters.

// AttrHwlocXML is the job attribute MPICH (4.2 and later) reads for the
// topology XML file of its node; served "unavailable" unless the owner
// makes one (Config.LateAttrs).
const AttrHwlocXML = "PMI_hwloc_xmlfile"

// lateAttr is one late attribute's value, or the requests waiting for it.
type lateAttr struct {
	val    string
	set    bool
	wanted bool // read once: the owner was asked (Ready.Wants)
	waits  []to
}

// SetJobAttr supplies the value of a late job attribute and answers the
// reads waiting for it. Setting it again changes nothing.
type SetJobAttr struct{ Key, Val string }

func (SetJobAttr) isOp() {}

// lateWait parks t if key is a late attribute still without its value.
func (c *Core) lateWait(key string, t to) bool {
	la := c.late[key]
	if la == nil || la.set {
		return false
	}
	if !la.wanted {
		la.wanted = true
		c.rd.Wants = append(c.rd.Wants, key)
	}
	la.waits = append(la.waits, t)
	return true
}

func (c *Core) setLate(key, val string) {
	la := c.late[key]
	if la == nil || la.set {
		return
	}
	la.val, la.set = val, true
	for _, t := range la.waits {
		c.reply(t, Reply{Found: true, Val: val})
	}
	la.waits = nil
}

// failLate answers every read waiting for a late attribute with err, in
// key order.
func (c *Core) failLate(err error) {
	for _, k := range c.lateKeys {
		la := c.late[k]
		for _, t := range la.waits {
			c.reply(t, Reply{Err: err})
		}
		la.waits = nil
	}
}

// SetJobAttr supplies the value of late attribute key (Config.LateAttrs).
func (a *Agent) SetJobAttr(key, val string) { a.step(SetJobAttr{Key: key, Val: val}) }
