// Package cfuzz drives libfastpmi's parsers (clib/layout.c: the segment
// header; clib/wire.c: the PMI-2 text framing; symbolic links here, so
// that the go command compiles them and tracks their changes) from Go
// tests through cgo,
// so that go test -fuzz fuzzes the C code and the tests can check it
// against package shm's own reading of the same bytes. Nothing imports
// it; it is the only cgo in the module, kept out of every package a
// program links.
package cfuzz

/*
#cgo CFLAGS: -Wall -Wextra -Werror -std=gnu11
#include <stdlib.h>
#include <string.h>
#include "fpmi.h"

static int layout_read(const unsigned char *b, unsigned long long size, struct fpmi_layout *l, char *err, int errlen)
{
    return fpmi_layout_read(b, size, l, err, (size_t)errlen);
}

// parse copies b into a malloc'd body and parses it; on success it
// re-encodes the message and stores the frame in *out (malloc'd).
static int parse(const char *b, int n, struct fpmi_msg *m)
{
    char *body = malloc((size_t)n + 1);
    if (body == NULL)
        return -1;
    memcpy(body, b, (size_t)n);
    return fpmi_wire_parse(body, (size_t)n, m);
}

static struct fpmi_pair *pair_at(struct fpmi_msg *m, int i) { return &m->pairs[i]; }
static void *buf_bytes(struct fpmi_buf *b) { return b->p; }
static void free_str(char *s) { free(s); }
static long frame_len(void *h) { return fpmi_frame_len(h); }
*/
import "C"

import "errors"

// Layout is the C library's reading of a segment header: the offsets it
// computed, or its refusal.
type Layout struct {
	Total, CtrlOff, RingOff, SlotOff, ResultOff, KVSIndexOff, KVSEntryOff, KVSArenaOff uint64
}

// ReadLayout runs fpmi_layout_read on the header bytes hdr (at least
// 4096, or a refusal) of a segment of size bytes.
func ReadLayout(hdr []byte, size uint64) (Layout, error) {
	if len(hdr) == 0 {
		hdr = []byte{0}
	}
	var l C.struct_fpmi_layout
	var msg [256]C.char
	p := C.CBytes(hdr)
	defer C.free(p)
	if len(hdr) < 4096 && size >= 4096 {
		return Layout{}, errors.New("harness: header shorter than the size claims")
	}
	if C.layout_read((*C.uchar)(p), C.ulonglong(size), &l, &msg[0], C.int(len(msg))) != 0 {
		return Layout{}, errors.New(C.GoString(&msg[0]))
	}
	return Layout{
		Total: uint64(l.total), CtrlOff: uint64(l.ctrl_off), RingOff: uint64(l.ring_off), SlotOff: uint64(l.slot_off),
		ResultOff: uint64(l.result_off), KVSIndexOff: uint64(l.kvs_index_off), KVSEntryOff: uint64(l.kvs_entry_off),
		KVSArenaOff: uint64(l.kvs_arena_off),
	}, nil
}

// Pair is one parsed key and value.
type Pair struct{ Key, Val string }

// ParseBody runs fpmi_wire_parse on a PMI-2 body: the command and pairs,
// or false if the library refused it.
func ParseBody(b []byte) (cmd string, pairs []Pair, ok bool) {
	var m C.struct_fpmi_msg
	p := C.CBytes(append(b[:len(b):len(b)], 0)) // never empty; b stays untouched
	defer C.free(p)
	if C.parse((*C.char)(p), C.int(len(b)), &m) != 0 {
		return "", nil, false
	}
	defer C.fpmi_msg_free(&m)
	cmd = C.GoString(m.cmd)
	for i := 0; i < int(m.npairs); i++ {
		pr := C.pair_at(&m, C.int(i))
		pairs = append(pairs, Pair{Key: C.GoString(pr.key), Val: C.GoStringN(pr.val, C.int(pr.vlen))})
	}
	return cmd, pairs, true
}

// Encode frames cmd and pairs with the library's encoder (fpmi_buf):
// the whole frame, length header included.
func Encode(cmd string, pairs []Pair) ([]byte, bool) {
	var b C.struct_fpmi_buf
	defer C.fpmi_buf_free(&b)
	cs := C.CString(cmd)
	C.fpmi_buf_start(&b, cs)
	C.free_str(cs)
	for _, p := range pairs {
		k, v := C.CString(p.Key), C.CString(p.Val)
		C.fpmi_buf_pair(&b, k, v, C.size_t(len(p.Val)))
		C.free_str(k)
		C.free_str(v)
	}
	if C.fpmi_buf_finish(&b) != 0 {
		return nil, false
	}
	return C.GoBytes(C.buf_bytes(&b), C.int(b.n)), true
}

// FrameLen runs fpmi_frame_len on a 6-byte length header.
func FrameLen(hdr [6]byte) int64 {
	p := C.CBytes(hdr[:])
	defer C.free(p)
	return int64(C.frame_len(p))
}
