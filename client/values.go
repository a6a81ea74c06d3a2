package client

import "github.com/fastpmi/fastpmi/shm"

// Values is an allgather's result: every rank's value, indexed by rank.
// On shared memory it is a view straight into the segment's result array:
// At returns a slice of shared memory, valid until this rank starts its
// second collective (fence or allgather) after the one that produced it.
// Do not modify it.
type Values struct {
	n     int
	rank  *shm.Rank // shared memory view, or nil
	epoch uint32
	vals  [][]byte // text protocol and singleton results
}

// Len returns the number of ranks.
func (v Values) Len() int { return v.n }

// At returns rank r's value, or nil if r is out of range or the view has
// been reused by a later allgather.
func (v Values) At(r int) []byte {
	if r < 0 || r >= v.n {
		return nil
	}
	if v.rank != nil {
		b, err := v.rank.Result(r, v.epoch)
		if err != nil {
			return nil
		}
		return b
	}
	return v.vals[r]
}
