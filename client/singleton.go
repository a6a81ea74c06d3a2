package client

import (
	"context"
	"fmt"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// singleton serves a process started without a launcher: rank 0 of 1, the
// KVS held in the process.
type singleton struct {
	kvs   map[string][]byte
	names map[string]string
	attrs map[string]string // node attributes
	colls uint32
	// results are the allgathers' values by epoch, each a copy taken at
	// the start. One is dropped once it has been read and two more
	// collectives have started (the lifetime of a shared-memory view);
	// an unread one stays, as the shared-memory transport keeps a copy.
	results map[uint32]*singleResult
}

type singleResult struct {
	val  []byte
	read bool
}

func newSingleton() *singleton {
	return &singleton{kvs: make(map[string][]byte), names: make(map[string]string), attrs: make(map[string]string),
		results: make(map[uint32]*singleResult)}
}

func (s *singleton) maxValue() int { return pmiwire.ValLenMax }

func (s *singleton) maxPut() (key, val int) { return pmiwire.KeyLenMax, pmiwire.ValLenMax }

func (s *singleton) put(key string, val []byte, _ Hint) error {
	s.kvs[key] = append([]byte(nil), val...)
	return nil
}

func (s *singleton) startFence(bool) (uint32, error) { return s.next(), nil }

func (s *singleton) startAllgather(val []byte, _ bool) (uint32, error) {
	e := s.next()
	s.results[e] = &singleResult{val: append([]byte{}, val...)}
	return e, nil
}

// next starts the next collective and drops the results it outlives.
func (s *singleton) next() uint32 {
	s.colls++
	for e, r := range s.results {
		if r.read && s.colls-e >= 2 {
			delete(s.results, e)
		}
	}
	return s.colls
}

func (s *singleton) done(uint32) (bool, error)              { return true, nil }
func (s *singleton) progress(context.Context, uint32) error { return nil }
func (s *singleton) block(uint32) error                     { return nil }
func (s *singleton) poll() error                            { return nil }
func (s *singleton) values(id uint32) Values {
	r := s.results[id]
	if r == nil { // a fence's, or dropped
		return Values{n: 1, vals: [][]byte{nil}}
	}
	r.read = true
	return Values{n: 1, vals: [][]byte{r.val}}
}

func (s *singleton) get(_ context.Context, key string, _ getOpts) ([]byte, error) {
	if v, ok := s.kvs[key]; ok {
		return append([]byte(nil), v...), nil
	}
	return nil, ErrNotFound
}

func (s *singleton) ring(_ context.Context, val []byte) (RingResult, error) {
	v := append([]byte(nil), val...)
	return RingResult{Rank: 0, Size: 1, Left: v, Right: v}, nil
}

func (s *singleton) jobAttr(_ context.Context, key string) (string, bool, error) {
	switch key {
	case "PMI_process_mapping":
		return "(vector,(0,1,1))", true, nil
	case "universeSize":
		return "1", true, nil
	}
	return "", false, nil
}

func (s *singleton) putNodeAttr(ctx context.Context, key, val string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.attrs[key] = val
	return nil
}

// nodeAttr: the only rank of its node waiting for a put would wait
// forever, so that fails at once.
func (s *singleton) nodeAttr(_ context.Context, key string, wait bool) (string, bool, error) {
	v, ok := s.attrs[key]
	if !ok && wait {
		return "", false, fmt.Errorf("node attribute %s: deadlock: the only rank waits for its own put", key)
	}
	return v, ok, nil
}

func (s *singleton) publish(ctx context.Context, name, port string) error {
	if err := ctx.Err(); err != nil {
		return err // not made, as the other transports' calls
	}
	if _, ok := s.names[name]; ok {
		return fmt.Errorf("name %q already published", name)
	}
	s.names[name] = port
	return nil
}

func (s *singleton) unpublish(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, ok := s.names[name]; !ok {
		return ErrNotFound
	}
	delete(s.names, name)
	return nil
}

func (s *singleton) lookup(_ context.Context, name string) (string, error) {
	if p, ok := s.names[name]; ok {
		return p, nil
	}
	return "", ErrNotFound
}

func (s *singleton) spawn(context.Context, *pmiwire.Spawn) (string, error) {
	return "", fmt.Errorf("spawn without a launcher: %w", ErrNotSupported)
}

func (s *singleton) abort(code int, msg string) error {
	return fmt.Errorf("abort(%d, %q) without a launcher: %w", code, msg, ErrNotSupported)
}

func (s *singleton) finalize(context.Context) error { return nil }
