package shm

import (
	"bytes"
	"encoding/binary"
)

// The node KVS table: an open-addressing hash index of uint32 buckets
// (0 = empty, else entry number + 1) over an append-only array of small
// fixed entries, whose keys and values sit in an append-only arena (so a
// 100-byte business card costs ~130 bytes of memory touched, not the
// key and value maxima). Only the agent writes it. An entry and its arena
// bytes are written completely with plain
// stores, then its bucket is published with an atomic Store; readers load
// buckets atomically, so an entry they reach is complete. Entries never
// change once published, so readers need neither a lock nor a seqlock
// retry and can return values in place. Visibility in PMI's sense (a key
// put before a fence is seen after it) comes from the entry's epoch tag
// against the published epoch word: a rank sees only entries whose epoch
// it has reached. The agent probes its own copy of the index (ownIndex),
// never the shared one that ranks could have overwritten.

// fnv1a is the 64-bit FNV-1a hash of b.
func fnv1a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// kvsFind probes for key, whose hash is h. It returns the offset of the
// matching entry and found, or the first empty bucket on the probe path
// (kvsBuckets if there is none). Every value read from shared memory is
// bounds-checked, so a corrupted table yields "not found", never a fault;
// the probe visits each bucket at most once.
//
// own, if not nil, is the agent's private copy of the index (Agent.index),
// probed instead of the shared one.
func (s *Segment) kvsFind(key []byte, h uint64, own []uint32) (off, empty uint64, found bool) {
	mask := uint64(s.l.kvsBuckets - 1)
	le := binary.LittleEndian
	b := h & mask
	for range s.l.kvsBuckets {
		var v uint64
		if own != nil {
			v = uint64(own[b])
		} else {
			v = uint64(s.u32(s.l.kvsIndexOff + 4*b).Load()) // pairs with KVSPut's Store: the entry is complete
		}
		if v == 0 {
			return 0, b, false
		}
		if v <= uint64(s.l.kvsCap) {
			off := s.l.kvsEntryOff + (v-1)*kvsEntryBytes
			e := s.mem[off : off+kvsEntryBytes]
			if le.Uint32(e[kvsHash:]) == uint32(h) && uint64(le.Uint32(e[kvsKeyLen:])) == uint64(len(key)) {
				if k, _, ok := s.kvsKV(e); ok && bytes.Equal(k, key) {
					return off, 0, true
				}
			}
		}
		b = (b + 1) & mask
	}
	return 0, uint64(s.l.kvsBuckets), false
}

// kvsKV returns the key and value bytes entry e names in the arena, or
// false if its lengths or offset do not fit the layout.
func (s *Segment) kvsKV(e []byte) (key, value []byte, ok bool) {
	le := binary.LittleEndian
	kl, vl, at := uint64(le.Uint32(e[kvsKeyLen:])), uint64(le.Uint32(e[kvsValLen:])), le.Uint64(e[kvsData:])
	if kl > uint64(s.l.kvsKeyMax) || vl > uint64(s.l.maxValue) || at > s.l.kvsArena || kl+vl > s.l.kvsArena-at {
		return nil, nil, false
	}
	a := s.l.kvsArenaOff + at
	return s.mem[a : a+kl : a+kl], s.mem[a+kl : a+kl+vl : a+kl+vl], true
}

// kvsBucketOf returns the bucket of the agent's index own that points at
// the entry at off, found by probing from h as kvsFind does (kvsBuckets
// if none does).
func (s *Segment) kvsBucketOf(off, h uint64, own []uint32) uint64 {
	mask := uint64(s.l.kvsBuckets - 1)
	want := uint32((off-s.l.kvsEntryOff)/kvsEntryBytes + 1)
	b := h & mask
	for range s.l.kvsBuckets {
		if own[b] == want {
			return b
		}
		b = (b + 1) & mask
	}
	return uint64(s.l.kvsBuckets)
}

// kvsValue returns the value of the entry at off and its epoch.
func (s *Segment) kvsValue(off uint64) ([]byte, uint32, bool) {
	e := s.mem[off : off+kvsEntryBytes]
	_, v, ok := s.kvsKV(e)
	if !ok {
		return nil, 0, false
	}
	return v, binary.LittleEndian.Uint32(e[kvsEpoch:]), true
}

// KVSPut inserts key → value, tagged with the fence epoch that makes it
// visible: ranks see it once the agent publishes that epoch. Keys are
// unique (ErrKeyExists); the table holds KVSCapacity entries (ErrKVSFull).
func (a *Agent) KVSPut(key, value []byte, epoch uint32) error {
	return a.kvsPut(key, value, epoch, false)
}

// KVSReplace is KVSPut that also replaces the value of an existing key (a
// key put again in a later fence): the new value goes into a new entry and
// the key's bucket is swung to it with one atomic store, so a reader sees
// either the old entry or the new one, each complete. Until the new
// entry's epoch is published a rank's Lookup reports the key absent (and
// the rank asks the agent, which already holds the new value).
func (a *Agent) KVSReplace(key, value []byte, epoch uint32) error {
	return a.kvsPut(key, value, epoch, true)
}

// kvsTombstone marks a bucket whose key was withdrawn: probes pass over it
// (it is not empty) and never match it (it names no entry).
const kvsTombstone = ^uint32(0)

// ownIndex returns the agent's private copy of the KVS hash index, made
// on first use: from the segment's index for a view attached later, empty
// for a segment this view laid out (whose index was empty before any rank
// could write it). Ranks can write the shared index, the agent's copy
// only the agent: a stray memset over the index must not make every
// insert scan the whole of it, nor the table look full.
func (a *Agent) ownIndex() []uint32 {
	if a.index == nil {
		s := a.s
		a.index = make([]uint32, s.l.kvsBuckets)
		if !a.indexFresh {
			for b := range a.index {
				a.index[b] = s.u32(s.l.kvsIndexOff + 4*uint64(b)).Load()
			}
		}
	}
	return a.index
}

// setBucket stores v into bucket b of the agent's index and of the
// shared one. The shared Store publishes the entry and its arena bytes
// written before it; it pairs with kvsFind's Load.
func (a *Agent) setBucket(b uint64, v uint32) {
	a.index[b] = v
	a.s.u32(a.s.l.kvsIndexOff + 4*b).Store(v)
}

func (a *Agent) kvsPut(key, value []byte, epoch uint32, replace bool) error {
	s := a.s
	if len(key) > s.l.kvsKeyMax {
		return ErrTooLarge
	}
	h := fnv1a(key)
	own := a.ownIndex()
	old, empty, found := s.kvsFind(key, h, own)
	if found {
		if !replace {
			return ErrKeyExists
		}
		if v, _, ok := s.kvsValue(old); ok && bytes.Equal(v, value) {
			return nil // same value: nothing to publish
		}
		// The bucket that points at the old entry takes the new one.
		empty = s.kvsBucketOf(old, h, own)
	}
	need := alignUp(uint64(len(key)+len(value)), kvsDataAlign)
	var err error
	switch {
	case len(value) > s.l.maxValue:
		err = ErrTooLarge
	case a.kvsN >= s.l.kvsCap || empty >= uint64(s.l.kvsBuckets) || a.kvsUsed > s.l.kvsArena || need > s.l.kvsArena-a.kvsUsed:
		err = ErrKVSFull
	}
	if err != nil {
		if found && empty < uint64(s.l.kvsBuckets) {
			// The old value must not stay readable: withdraw the key, so
			// ranks ask the agent for it.
			a.setBucket(empty, kvsTombstone)
		}
		return err
	}
	at := a.kvsUsed
	data := s.mem[s.l.kvsArenaOff+at : s.l.kvsArenaOff+at+uint64(len(key)+len(value))]
	copy(data, key)
	copy(data[len(key):], value)
	n := uint64(a.kvsN)
	off := s.l.kvsEntryOff + n*kvsEntryBytes
	e := s.mem[off : off+kvsEntryBytes]
	le := binary.LittleEndian
	le.PutUint32(e[kvsEpoch:], epoch)
	le.PutUint32(e[kvsKeyLen:], uint32(len(key)))
	le.PutUint32(e[kvsValLen:], uint32(len(value)))
	le.PutUint32(e[kvsHash:], uint32(h))
	le.PutUint64(e[kvsData:], at)
	a.setBucket(empty, uint32(n+1)) // publishes the entry and its arena bytes
	a.kvsN++
	a.kvsUsed += need
	s.u32(offKVSCount).Store(uint32(a.kvsN))        // informational; no load depends on it for ordering
	s.u32(offKVSArenaUsed).Store(uint32(a.kvsUsed)) // informational, for an agent view attached later
	return nil
}

// KVSGet returns the value stored for key, whatever its epoch, and the
// epoch it was put in (the agent serving a get for another node).
func (a *Agent) KVSGet(key []byte) (value []byte, epoch uint32, ok bool) {
	off, _, found := a.s.kvsFind(key, fnv1a(key), a.ownIndex())
	if !found {
		return nil, 0, false
	}
	return a.s.kvsValue(off)
}

// KVSLen returns the number of entries in the KVS.
func (a *Agent) KVSLen() int { return a.kvsN }

// Lookup returns the value of key as a view into shared memory, if the key
// was put in an epoch this rank can see (one the agent has published). The
// view stays valid until the segment is closed: entries never change.
func (r *Rank) Lookup(key []byte) ([]byte, bool) {
	pub := r.epoch.Load() // pairs with Publish: entries tagged up to pub are visible
	off, _, found := r.s.kvsFind(key, fnv1a(key), nil)
	if !found {
		return nil, false
	}
	v, e, ok := r.s.kvsValue(off)
	if !ok || !reached(pub, e) {
		return nil, false
	}
	return v, true
}
