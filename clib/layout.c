/* layout.c: a segment's header, validated as shm.readHeader does. */
#include <stdio.h>
#include <string.h>

#include "fpmi.h"

static uint64_t le64(const unsigned char *b, uint64_t off)
{
    uint64_t v;
    memcpy(&v, b + off, 8);
    return v;
}

static uint64_t le32(const unsigned char *b, uint64_t off)
{
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

#define fail fpmi_errf

static int valid_ring(uint64_t n)
{
    return n >= FPMI_MIN_RING_BYTES && n <= FPMI_MAX_RING_BYTES && (n & (n - 1)) == 0;
}

/* buckets is the KVS index size: the next power of two >= 2*capacity. */
static uint64_t buckets(uint64_t cap)
{
    uint64_t b = 1;
    while (b < 2 * cap)
        b <<= 1;
    return b;
}

/* compute lays the regions out as shm.computeLayout: header, control
 * blocks and ready bitmap, rings, slots, results (two parities), KVS
 * index, entries, arena. The sizes were range-checked, so no product
 * overflows; FPMI_MAX_TOTAL bounds the sum. */
static void compute(struct fpmi_layout *l)
{
    uint64_t n = l->local_ranks, off;

    l->kvs_buckets = buckets(l->kvs_cap);
    l->ring_stride = l->req_ring + l->resp_ring;
    l->slot_bytes = align_up(FPMI_SLOT_DATA + l->max_value, FPMI_SHM_CACHE_LINE);
    l->result_stride = align_up(FPMI_RES_DATA + l->max_value, 8);
    l->result_buf_bytes = align_up(l->world_size * l->result_stride, FPMI_SHM_REGION_ALIGN);
    off = FPMI_SHM_HEADER_BYTES;
    l->ctrl_off = off;
    l->ready_off = off + n * FPMI_CTRL_STRIDE;
    off = align_up(l->ready_off + 8 * ((n + 63) / 64), FPMI_SHM_REGION_ALIGN);
    l->ring_off = off;
    off = align_up(off + n * l->ring_stride, FPMI_SHM_REGION_ALIGN);
    l->slot_off = off;
    off = align_up(off + n * 2 * l->slot_bytes, FPMI_SHM_REGION_ALIGN);
    l->result_off = off;
    off += 2 * l->result_buf_bytes;
    l->kvs_index_off = off;
    off = align_up(off + l->kvs_buckets * 4, FPMI_SHM_REGION_ALIGN);
    l->kvs_entry_off = off;
    off = align_up(off + l->kvs_cap * FPMI_KVS_ENTRY_BYTES, FPMI_SHM_REGION_ALIGN);
    l->kvs_arena_off = off;
    off += l->kvs_arena;
    l->total = off;
}

int fpmi_layout_read(const unsigned char *b, uint64_t size, struct fpmi_layout *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (size < FPMI_SHM_HEADER_BYTES)
        return fail(err, errlen, "segment of %llu bytes is shorter than its %llu-byte header",
                    (unsigned long long)size, (unsigned long long)FPMI_SHM_HEADER_BYTES);
    if (le64(b, FPMI_HDR_MAGIC) != FPMI_SHM_MAGIC)
        return fail(err, errlen, "bad magic %#llx, want %#llx (not a fastpmi segment)",
                    (unsigned long long)le64(b, FPMI_HDR_MAGIC), (unsigned long long)FPMI_SHM_MAGIC);
    if (le32(b, FPMI_HDR_VERSION) != FPMI_SHM_LAYOUT_VERSION)
        return fail(err, errlen, "layout version %llu, this library reads %llu",
                    (unsigned long long)le32(b, FPMI_HDR_VERSION), (unsigned long long)FPMI_SHM_LAYOUT_VERSION);
    if (le32(b, FPMI_HDR_HEADER_BYTES) != FPMI_SHM_HEADER_BYTES)
        return fail(err, errlen, "header of %llu bytes, want %llu", (unsigned long long)le32(b, FPMI_HDR_HEADER_BYTES),
                    (unsigned long long)FPMI_SHM_HEADER_BYTES);
    l->local_ranks = le32(b, FPMI_HDR_LOCAL_RANKS);
    l->world_size = le32(b, FPMI_HDR_WORLD_SIZE);
    l->max_value = le32(b, FPMI_HDR_MAX_VALUE);
    l->req_ring = le32(b, FPMI_HDR_REQ_RING_BYTES);
    l->resp_ring = le32(b, FPMI_HDR_RESP_RING_BYTES);
    l->kvs_cap = le32(b, FPMI_HDR_KVS_CAPACITY);
    l->kvs_key_max = le32(b, FPMI_HDR_KVS_KEY_MAX);
    l->kvs_arena = le32(b, FPMI_HDR_KVS_ARENA_PAGES) * FPMI_SHM_REGION_ALIGN;
    if (l->local_ranks < 1 || l->local_ranks > FPMI_MAX_LOCAL_RANKS)
        return fail(err, errlen, "header sizes: %llu local ranks", (unsigned long long)l->local_ranks);
    if (l->world_size < l->local_ranks || l->world_size > FPMI_MAX_WORLD_SIZE)
        return fail(err, errlen, "header sizes: world size %llu", (unsigned long long)l->world_size);
    if (l->max_value < 1 || l->max_value > FPMI_MAX_VALUE_BYTES)
        return fail(err, errlen, "header sizes: max value %llu", (unsigned long long)l->max_value);
    if (!valid_ring(l->req_ring) || !valid_ring(l->resp_ring))
        return fail(err, errlen, "header sizes: rings of %llu and %llu bytes", (unsigned long long)l->req_ring,
                    (unsigned long long)l->resp_ring);
    if (l->kvs_cap < 1 || l->kvs_cap > FPMI_MAX_KVS_ENTRIES || l->kvs_key_max < 1 ||
        l->kvs_key_max > FPMI_MAX_KVS_KEY_MAX)
        return fail(err, errlen, "header sizes: kvs of %llu entries, keys of %llu bytes", (unsigned long long)l->kvs_cap,
                    (unsigned long long)l->kvs_key_max);
    if (l->kvs_arena < align_up(l->kvs_key_max + l->max_value, FPMI_KVS_DATA_ALIGN) || l->kvs_arena > FPMI_MAX_KVS_ARENA)
        return fail(err, errlen, "header sizes: kvs arena of %llu bytes", (unsigned long long)l->kvs_arena);
    compute(l);
    if (l->total > FPMI_MAX_TOTAL)
        return fail(err, errlen, "segment of %llu bytes exceeds the limit", (unsigned long long)l->total);
    const struct {
        const char *name;
        uint64_t got, want;
    } stored[] = {
        {"total length", le64(b, FPMI_HDR_TOTAL), l->total},
        {"kvs buckets", le32(b, FPMI_HDR_KVS_BUCKETS), l->kvs_buckets},
        {"control offset", le64(b, FPMI_HDR_CTRL_OFF), l->ctrl_off},
        {"ring offset", le64(b, FPMI_HDR_RING_OFF), l->ring_off},
        {"slot offset", le64(b, FPMI_HDR_SLOT_OFF), l->slot_off},
        {"result offset", le64(b, FPMI_HDR_RESULT_OFF), l->result_off},
        {"kvs index offset", le64(b, FPMI_HDR_KVS_INDEX_OFF), l->kvs_index_off},
        {"kvs entry offset", le64(b, FPMI_HDR_KVS_ENTRY_OFF), l->kvs_entry_off},
        {"control stride", le32(b, FPMI_HDR_CTRL_STRIDE), FPMI_CTRL_STRIDE},
        {"ring stride", le32(b, FPMI_HDR_RING_STRIDE), l->ring_stride},
        {"slot size", le32(b, FPMI_HDR_SLOT_BYTES), l->slot_bytes},
        {"result stride", le32(b, FPMI_HDR_RESULT_STRIDE), l->result_stride},
        {"kvs entry size", le32(b, FPMI_HDR_KVS_ENTRY_BYTES), FPMI_KVS_ENTRY_BYTES},
    };
    for (size_t i = 0; i < sizeof stored / sizeof stored[0]; i++)
        if (stored[i].got != stored[i].want)
            return fail(err, errlen, "header %s %llu, layout computes %llu", stored[i].name,
                        (unsigned long long)stored[i].got, (unsigned long long)stored[i].want);
    if (l->total != size)
        return fail(err, errlen, "header says %llu bytes, segment has %llu", (unsigned long long)l->total,
                    (unsigned long long)size);
    return 0;
}
