package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// Under PolicyAuto a node's unhinted puts of one fence travel with it up
// to AutoDenseMax bytes; past that they are placed as sparse keys and
// the fence carries none of them. A single-node job keeps them all.
func TestAutoPolicyThreshold(t *testing.T) {
	val := strings.Repeat("v", 1000)
	for _, tc := range []struct {
		name        string
		size, puts  int
		wantPlaced  int
		wantInFence int
	}{
		{"small share travels with the fence", 4, 10, 0, 10},
		{"large share stays sparse", 4, AutoDenseMax/1000 + 5, AutoDenseMax/1000 + 5, 0},
		{"one node keeps everything", 2, AutoDenseMax/1000 + 5, 0, AutoDenseMax/1000 + 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{JobID: "j", Size: tc.size, Local: []int{0, 1}, KVS: PolicyAuto}
			c := NewCore(&cfg, 0, 2)
			for i := range tc.puts {
				if err := c.Step(Put{Local: i % 2, Key: fmt.Sprintf("k%d", i), Val: val, Hint: pmiwire.HintNone}); err != nil {
					t.Fatal(err)
				}
			}
			c.Step(Fence{Local: 0})
			c.Step(Fence{Local: 1})
			rd := c.Ready()
			placed, inFence := 0, -1
			for _, u := range rd.Upstream {
				switch u.Kind {
				case UpPlace:
					placed++
				case UpFence:
					inFence = len(u.KVs)
				}
			}
			if placed != tc.wantPlaced || inFence != tc.wantInFence {
				t.Errorf("%d puts of %d bytes: %d placed, %d in the fence; want %d and %d", tc.puts, len(val), placed, inFence, tc.wantPlaced, tc.wantInFence)
			}
			if s := c.Stats(); (s.AutoSparse == 1) != (tc.wantPlaced > 0) {
				t.Errorf("Stats.AutoSparse = %d", s.AutoSparse)
			}
		})
	}
}

func TestParseKVSPolicy(t *testing.T) {
	for in, want := range map[string]KVSPolicy{"": PolicyAuto, "auto": PolicyAuto, "dense": PolicyDense, "sparse": PolicySparse} {
		if got, err := ParseKVSPolicy(in); err != nil || got != want {
			t.Errorf("ParseKVSPolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseKVSPolicy("lazy"); err == nil {
		t.Error("ParseKVSPolicy(lazy) succeeded")
	}
}

// Keys other nodes place here count against the node's quota: a put
// that passes it is refused (the placing node's fence fails with the
// error), one that replaces a key of the same size at the limit is not.
func TestPlaceQuota(t *testing.T) {
	cfg := Config{JobID: "j", Size: 4, Local: []int{0, 1}}
	c := NewCore(&cfg, 0, 2)
	if err := c.Step(PlaceKV{Key: "k", Val: "0123456789", Owner: 3}); err != nil {
		t.Fatal(err)
	}
	c.placedBytes = MaxPutBytesPerNode - 5 // as if the node held nearly its quota
	if err := c.Step(PlaceKV{Key: "big", Val: "0123456789", Owner: 3}); !errors.Is(err, ErrQuota) {
		t.Errorf("placing past the quota: %v, want ErrQuota", err)
	}
	if err := c.Step(PlaceKV{Key: "k", Val: "abcdefghij", Owner: 3}); err != nil {
		t.Errorf("replacing a key with a value of its size at the quota: %v", err)
	}
	if s := c.Stats(); s.PlaceRefused != 1 {
		t.Errorf("Stats.PlaceRefused = %d, want 1", s.PlaceRefused)
	}
	if v, ok := c.sparse["k"]; !ok || v != "abcdefghij" {
		t.Errorf("placed key k = %q, %v", v, ok)
	}
	if _, ok := c.sparse["big"]; ok {
		t.Error("the refused key was stored")
	}
}
