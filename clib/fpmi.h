/* fpmi.h: libfastpmi's internal interfaces.
 *
 * The library has three parts: the segment (layout.c: validating a
 * segment's header against the layout computed here from the constants
 * generated from Go's package shm; shm.c: rings, waits, the KVS and the
 * allgather array, the rank side of shm/doc.go's protocol), the PMI-2 text
 * protocol (wire.c: framing and parsing; text.c: requests on PMI_FD or
 * PMI_PORT) and the API (pmi2.c: <slurm/pmi2.h> and fastpmi/pmi2ext.h over
 * whichever transport PMI2_Init chose, serialised by one mutex). */
#ifndef FPMI_H
#define FPMI_H

#include <stddef.h>
#include <stdint.h>

#include "fastpmi_layout.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libfastpmi reads the segment's little-endian fields as native: little-endian hosts only"
#endif

/* fpmi_errf formats a message into err[errlen] and returns -1, the
 * failure value of every internal function (wire.c). */
int fpmi_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- layout.c ---------------------------------------------------------- */

/* fpmi_layout is a segment's geometry, computed from its sizes exactly as
 * shm.computeLayout does. */
struct fpmi_layout {
    uint64_t local_ranks, world_size, max_value, req_ring, resp_ring;
    uint64_t kvs_cap, kvs_key_max, kvs_buckets, kvs_arena;
    uint64_t ctrl_off, ready_off, ring_off, slot_off, result_off, kvs_index_off, kvs_entry_off, kvs_arena_off;
    uint64_t ring_stride, slot_bytes, result_stride, result_buf_bytes, total;
};

/* fpmi_layout_read validates the header at the start of a size-byte
 * segment (b holds at least min(size, FPMI_SHM_HEADER_BYTES) bytes) and
 * fills l. It trusts nothing: sizes are range-checked, the layout is
 * recomputed and every stored offset must equal the computed one. On
 * failure it returns -1 with a message in err. */
int fpmi_layout_read(const unsigned char *b, uint64_t size, struct fpmi_layout *l, char *err, size_t errlen);

/* ---- wire.c ------------------------------------------------------------ */

struct fpmi_pair {
    const char *key, *val; /* NUL-terminated views into the message body */
    size_t vlen;
};

/* fpmi_msg is one parsed PMI-2 body ("cmd=name;k=v;...;"). */
struct fpmi_msg {
    char *body; /* owned, NUL-terminated */
    const char *cmd;
    struct fpmi_pair *pairs; /* owned */
    int npairs;
};

/* fpmi_wire_parse parses body[0..n) in place (it takes ownership of body,
 * a malloc'd buffer of at least n+1 bytes): pairs end with ';', ";;" is a
 * literal ';'. It returns 0, or -1 for a body that is not a PMI-2 command
 * (m is then empty and body freed). */
int fpmi_wire_parse(char *body, size_t n, struct fpmi_msg *m);
void fpmi_msg_free(struct fpmi_msg *m);
/* fpmi_msg_get returns the first value of key, or NULL. */
const char *fpmi_msg_get(const struct fpmi_msg *m, const char *key, size_t *vlen);

/* fpmi_frame_len reads a 6-byte PMI-2 length header (digits padded with
 * spaces on either side): the body length, or -1. */
long fpmi_frame_len(const char hdr[6]);

/* fpmi_buf builds a request frame. */
struct fpmi_buf {
    char *p;
    size_t n, cap;
    int oom;
};
void fpmi_buf_start(struct fpmi_buf *b, const char *cmd);
void fpmi_buf_pair(struct fpmi_buf *b, const char *key, const char *val, size_t vlen);
void fpmi_buf_pairs(struct fpmi_buf *b, const char *key, const char *val);
void fpmi_buf_pairi(struct fpmi_buf *b, const char *key, long v);
/* FPMI_FRAME_MAX is the longest request body sent: servers refuse longer
 * ones (fastpmi's agent and Slurm's client both stop at 64 KiB), and
 * fastpmi's agent ends the job for one. */
#define FPMI_FRAME_MAX (64 * 1024)
/* fpmi_buf_finish writes the length header; -1 if out of memory or the
 * body is longer than FPMI_FRAME_MAX. */
int fpmi_buf_finish(struct fpmi_buf *b);
void fpmi_buf_free(struct fpmi_buf *b);

/* ---- shm.c ------------------------------------------------------------- */

/* fpmi_shm is this rank's side of the node segment (shm/doc.go): it
 * produces its request ring, consumes its response ring, writes its own
 * control line and slots, and reads the rest in place. Used under the
 * API's mutex only. */
struct fpmi_shm;

/* fpmi_shm_open maps the segment on fd, validates it for local rank local
 * of a job of world ranks, announces the rank and says hello. live_fd
 * (the PMI_FD socket, or -1) is polled while waiting so that a vanished
 * agent ends a wait. On failure it returns NULL with a message in err, and
 * nothing was written to the segment. */
struct fpmi_shm *fpmi_shm_open(int fd, int local, int world, int live_fd, char *err, size_t errlen);
void fpmi_shm_close(struct fpmi_shm *s);
int fpmi_shm_max_value(const struct fpmi_shm *s);

/* Each returns 0, or -1 with a message in err. */
int fpmi_shm_put(struct fpmi_shm *s, const char *key, const char *val, size_t vlen, int hint, char *err, size_t errlen);
/* fpmi_shm_next_epoch is the epoch the next collective will have: one
 * after the last this rank started, or after the last published if the
 * agent failed (and skipped this rank past) epochs it never entered. */
uint32_t fpmi_shm_next_epoch(struct fpmi_shm *s);
/* fpmi_shm_start_fence and fpmi_shm_start_allgather start a collective;
 * detached says the caller goes on working (PMIX_KVS_Ifence,
 * PMIX_Iallgather) until it waits: fpmi_shm_will_wait tells the agent the
 * rank is about to wait for epoch, unless it is published already (the
 * agent's deadlock check counts only ranks that wait). */
int fpmi_shm_start_fence(struct fpmi_shm *s, int detached, uint32_t *epoch, char *err, size_t errlen);
int fpmi_shm_start_allgather(struct fpmi_shm *s, const void *val, size_t n, int detached, uint32_t *epoch, char *err,
                             size_t errlen);
int fpmi_shm_will_wait(struct fpmi_shm *s, uint32_t epoch, char *err, size_t errlen);
/* fpmi_shm_done reports whether collective epoch completed (1) or not yet
 * (0, only when wait is 0), -2 if the agent failed it (a deadlock, say;
 * its reason in err), or -1 if the exchange failed (the agent is gone). */
int fpmi_shm_done(struct fpmi_shm *s, uint32_t epoch, int wait, char *err, size_t errlen);
/* fpmi_shm_result gives global rank g's value of allgather epoch in
 * place; -1 if g is out of range or the entry is not that epoch's. */
int fpmi_shm_result(struct fpmi_shm *s, int g, uint32_t epoch, const char **v, size_t *n);
/* fpmi_shm_lookup finds a fenced key in the node KVS, in place: 1 found. */
int fpmi_shm_lookup(struct fpmi_shm *s, const char *key, size_t klen, const char **v, size_t *n);
/* fpmi_shm_call sends a request (payload a then b) and waits for its
 * response: status FPMI_STATUS_*, the payload copied into the handle's
 * buffer (valid until the next call). It returns 0, 1 if the agent
 * refused the request (its reason in err), or -1 if the exchange failed. */
int fpmi_shm_call(struct fpmi_shm *s, uint16_t op, uint16_t flags, const void *a, size_t an, const void *b, size_t bn,
                  uint16_t *status, const char **resp, size_t *rlen, char *err, size_t errlen);
/* fpmi_shm_abort may be called without the API's mutex (PMI2_Abort): it
 * sends the abort (msg cut at FPMI_ABORT_MSG_MAX bytes) under the request
 * ring's own lock, waiting at most a second for it. */
#define FPMI_ABORT_MSG_MAX 1024
int fpmi_shm_abort(struct fpmi_shm *s, int code, const char *msg);
int fpmi_shm_finalize(struct fpmi_shm *s, char *err, size_t errlen);

/* ---- text.c ------------------------------------------------------------ */

/* fpmi_treq is one request on the text protocol. Every request carries
 * thrid=<id>; a response with thrid completes its request, one without
 * (Slurm does not echo thrid) the oldest outstanding request of its name,
 * else the oldest. A request is
 * owned by whoever sent it and freed with fpmi_treq_free once done. */
struct fpmi_treq {
    uint32_t id;
    char cmd[40];
    int done;
    int rc;              /* the response's rc, or -1 for a mismatched response */
    struct fpmi_msg resp; /* valid once done */
    struct fpmi_treq *next; /* in the transport's outstanding list */
};

struct fpmi_text;

/* fpmi_text_open takes fd, a connected PMI socket. */
struct fpmi_text *fpmi_text_open(int fd);
void fpmi_text_close(struct fpmi_text *t);
/* fpmi_text_init runs PMI-2's handshake: init, then fullinit for pmiid
 * (PMI_ID or PMI_RANK; NULL if unknown) and jobid (may be NULL). The
 * fullinit response is left in *resp for the caller (free it). */
int fpmi_text_init(struct fpmi_text *t, const char *pmiid, const char *jobid, struct fpmi_treq **resp, char *err,
                   size_t errlen);
/* fpmi_text_send adds thrid to b (started with cmd), frames and writes
 * it; the request is outstanding until a response completes it. */
struct fpmi_treq *fpmi_text_send(struct fpmi_text *t, struct fpmi_buf *b, const char *cmd, char *err, size_t errlen);
/* fpmi_text_progress reads one response (blocking) and completes its
 * request; -1 if the connection failed or the response is malformed. */
int fpmi_text_progress(struct fpmi_text *t, char *err, size_t errlen);
/* fpmi_text_call sends and waits; on 0 the done request is in *out. */
int fpmi_text_call(struct fpmi_text *t, struct fpmi_buf *b, const char *cmd, struct fpmi_treq **out, char *err,
                   size_t errlen);
/* fpmi_text_write writes a frame without expecting a response (abort);
 * it may be called without the API's mutex and waits at most a second
 * for a frame another thread is writing. */
int fpmi_text_write(struct fpmi_text *t, struct fpmi_buf *b);
/* fpmi_text_write_raw is fpmi_text_write of bytes already framed (a PMI-1
 * line to Hydra). */
int fpmi_text_write_raw(struct fpmi_text *t, const char *p, size_t n);
/* fpmi_text_notify writes a request that has no response (fastpmi-block)
 * with a thrid of its own that no request waits for: an error response
 * the server might send is then unexpected, not taken for another's. */
int fpmi_text_notify(struct fpmi_text *t, struct fpmi_buf *b);
/* fpmi_text_drain waits until no request is outstanding. */
int fpmi_text_drain(struct fpmi_text *t, char *err, size_t errlen);
void fpmi_treq_free(struct fpmi_treq *r);
int fpmi_text_fd(const struct fpmi_text *t);

#endif
