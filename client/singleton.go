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
	last  []byte // the last allgather's value
}

func newSingleton() *singleton {
	return &singleton{kvs: make(map[string][]byte), names: make(map[string]string), attrs: make(map[string]string)}
}

func (s *singleton) maxValue() int { return pmiwire.ValLenMax }

func (s *singleton) put(key string, val []byte, _ Hint) error {
	s.kvs[key] = append([]byte(nil), val...)
	return nil
}

func (s *singleton) startFence() (uint32, error) { s.colls++; return s.colls, nil }

func (s *singleton) startAllgather(val []byte) (uint32, error) {
	s.colls++
	s.last = append(s.last[:0], val...)
	return s.colls, nil
}

func (s *singleton) done(uint32) (bool, error)              { return true, nil }
func (s *singleton) progress(context.Context, uint32) error { return nil }
func (s *singleton) poll() error                            { return nil }
func (s *singleton) values(uint32) Values                   { return Values{n: 1, vals: [][]byte{s.last}} }

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

func (s *singleton) putNodeAttr(_ context.Context, key, val string) error {
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

func (s *singleton) publish(_ context.Context, name, port string) error {
	if _, ok := s.names[name]; ok {
		return fmt.Errorf("name %q already published", name)
	}
	s.names[name] = port
	return nil
}

func (s *singleton) unpublish(_ context.Context, name string) error {
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
