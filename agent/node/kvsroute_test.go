package node

import (
	"fmt"
	"testing"
)

// The router's answers per strategy, against what the research's designs
// say: DKVS places and asks at the key's hash owner; Direct asks the
// source rank's node when the get names it and otherwise behaves as
// Tree; Tree places and asks at the parent, and no agent is final.
func TestRouter(t *testing.T) {
	spec := &Spec{Size: 8, Nodes: [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}}
	owners := map[int]int{}
	for i := range 1000 {
		key := fmt.Sprintf("key-%d", i)
		o := newRouter(StrategyDKVS, spec, 0, atRoot).owner(key)
		if o < 0 || o >= 4 {
			t.Fatalf("owner(%s) = %d", key, o)
		}
		owners[o]++
		for self := range 4 {
			d := newRouter(StrategyDKVS, spec, self, atRoot)
			if d.owner(key) != o {
				t.Fatalf("owner(%s) differs between nodes", key)
			}
			to, ok := d.placeAt(key)
			if to != o || ok != (o != self) {
				t.Fatalf("dkvs node %d: placeAt(%s) = %d,%v; owner %d", self, key, to, ok, o)
			}
			if d.fetchFrom(key, 5) != o || d.final(key, 5) != (o == self) {
				t.Fatalf("dkvs node %d: fetchFrom/final(%s) ignore the owner %d", self, key, o)
			}
			x := newRouter(StrategyDirect, spec, self, self-1)
			if to, ok := x.placeAt(key); to != self-1 || !ok {
				t.Fatalf("direct node %d: placeAt(%s) = %d,%v; want the parent (Tree fallback)", self, key, to, ok)
			}
			if x.fetchFrom(key, 6) != 2 || x.final(key, 6) != (self == 2) {
				t.Fatalf("direct node %d: a get naming rank 6 goes to %d (final %v); want node 2", self, x.fetchFrom(key, 6), x.final(key, 6))
			}
			if x.fetchFrom(key, -1) != self-1 || x.final(key, -1) {
				t.Fatalf("direct node %d: a get naming no rank goes to %d (final %v); want the parent, not final", self, x.fetchFrom(key, -1), x.final(key, -1))
			}
			tr := newRouter(StrategyTree, spec, self, self-1)
			if to, ok := tr.placeAt(key); to != self-1 || !ok || tr.fetchFrom(key, 6) != self-1 || tr.final(key, -1) {
				t.Fatalf("tree node %d: placeAt %d,%v fetchFrom %d final %v; want the parent, never final", self, to, ok, tr.fetchFrom(key, 6), tr.final(key, -1))
			}
		}
	}
	for o := range 4 {
		if owners[o] < 150 {
			t.Errorf("node %d owns %d of 1000 keys: the hash does not spread", o, owners[o])
		}
	}
	for _, s := range []string{"", "direct", "dkvs", "tree"} {
		if _, err := ParseStrategy(s); err != nil {
			t.Errorf("ParseStrategy(%q): %v", s, err)
		}
	}
	if _, err := ParseStrategy("gossip"); err == nil {
		t.Error("ParseStrategy(gossip) succeeded")
	}
}

// KVSMsg.Check refuses what no agent sends.
func TestKVSMsgCheck(t *testing.T) {
	long := string(make([]byte, 65))
	for _, tc := range []struct {
		m  KVSMsg
		ok bool
	}{
		{KVSMsg{Op: KVSPlace, Puts: []KVSPut{{"k", "v", 3}, {"l", "", -1}}}, true},
		{KVSMsg{Op: KVSGet, Key: "k", Src: -1}, true},
		{KVSMsg{Op: KVSAck, ID: 4}, true},
		{KVSMsg{Op: KVSVal, Key: "k", Found: true, Val: "v"}, true},
		{KVSMsg{Op: "delete", Key: "k"}, false},
		{KVSMsg{Op: KVSPlace}, false},
		{KVSMsg{Op: KVSPlace, Puts: make([]KVSPut, MaxPlaceBatch+1)}, false},
		{KVSMsg{Op: KVSPlace, Puts: []KVSPut{{"", "v", 0}}}, false},
		{KVSMsg{Op: KVSPlace, Puts: []KVSPut{{long + long, "v", 0}}}, false},
		{KVSMsg{Op: KVSPlace, Puts: []KVSPut{{"k", string(make([]byte, 2000)), 0}}}, false},
		{KVSMsg{Op: KVSPlace, Puts: []KVSPut{{"k", "v", -2}}}, false},
		{KVSMsg{Op: KVSGet, Key: "k", Src: 8}, false},
		{KVSMsg{Op: KVSGet, Key: "", Src: 1}, false},
	} {
		if err := tc.m.Check(8); (err == nil) != tc.ok {
			t.Errorf("Check(%+v) = %v, want ok=%v", tc.m, err, tc.ok)
		}
	}
}
