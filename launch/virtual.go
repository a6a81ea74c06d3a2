package launch

// startVirtual runs the node's ranks as goroutines (Config.Virtual). It is
// filled in by the scale benchmark's workloads.
func (n *node) startVirtual() {
	for _, g := range n.ranks {
		n.emit(eventMsg{Kind: evkStartErr, Rank: g, Msg: "virtual ranks: unknown workload " + n.cfg.Virtual})
		return
	}
}
