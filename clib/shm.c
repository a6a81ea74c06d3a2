/* shm.c: the rank side of the node segment, as shm/doc.go specifies it
 * and client/shm.go speaks it.
 *
 * Every shared word is accessed with a sequentially consistent __atomic
 * operation (Go's sync/atomic); plain fields are little-endian and read
 * with memcpy. The ordering edges are the Go side's:
 *   - request ring: records, then the tail store (publishes them), then the
 *     ready bit's or, then the doorbell signal; the agent's head store
 *     hands space back (our head load pairs with it);
 *   - response ring: our tail load pairs with the agent's tail store; our
 *     head store hands the record back;
 *   - the slot is written before the allgather request that names it;
 *   - the epoch load pairs with the agent's publish: result entries and KVS
 *     entries tagged up to it are complete; a KVS bucket load pairs with
 *     the agent's bucket store (the entry it names is complete);
 *   - waking (shm/wait.go's event): a sleeper loads the futex word, counts
 *     itself in the sleepers word, re-checks its condition, then sleeps on
 *     the word; a signaller stores its state, then loads sleepers and only
 *     if non-zero bumps the word and wakes it. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fpmi.h"

/* errEpochs is how many failed collectives' messages are kept. */
#define ERR_EPOCHS 8

struct fpmi_shm {
    unsigned char *mem;
    struct fpmi_layout l;
    int local;
    int live_fd;   /* PMI_FD, polled for hang-up while waiting; -1 if none */
    pid_t ppid;    /* the agent (our parent) at open; a change means it died */
    int spins;     /* condition checks before sleeping (0: sleep at once) */

    /* request ring (producer), guarded by wmu: taken by every push (under
     * the API's mutex) and by fpmi_shm_abort (without it). A zero
     * pthread_mutex_t is an unlocked default mutex (shm_store, calloc). */
    pthread_mutex_t wmu;
    unsigned char *rq;
    uint64_t rq_size, rq_pos, rq_head_cache;
    /* response ring (consumer) */
    unsigned char *rs;
    uint64_t rs_size, rs_pos, rs_tail_cache;

    uint32_t colls; /* collectives started: the last epoch used (next_epoch) */
    uint32_t seq;   /* request ids */
    struct {
        uint32_t epoch;
        int used;
        char msg[200];
    } errs[ERR_EPOCHS]; /* failed epochs, from OpError, round robin */
    int errs_next;

    /* the response waited for, copied out */
    int got;
    uint16_t resp_op, resp_flags;
    char *buf;
    size_t buf_len, buf_cap;
};

#define fail fpmi_errf

static uint32_t *u32(struct fpmi_shm *s, uint64_t off) { return (uint32_t *)(void *)(s->mem + off); }
static uint64_t *u64(struct fpmi_shm *s, uint64_t off) { return (uint64_t *)(void *)(s->mem + off); }
static uint32_t load32(uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static uint64_t load64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static void store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static uint64_t ctrl(struct fpmi_shm *s) { return s->l.ctrl_off + (uint64_t)s->local * FPMI_CTRL_STRIDE; }
static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
/* reached: epoch counter cur has reached want (both wrap at 2^32). */
static int reached(uint32_t cur, uint32_t want) { return (int32_t)(cur - want) >= 0; }

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint16_t rd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void put_header(unsigned char *p, uint32_t n, uint16_t op, uint16_t flags, uint32_t seq, uint32_t epoch)
{
    memcpy(p + FPMI_MSG_LEN, &n, 4);
    memcpy(p + FPMI_MSG_OP, &op, 2);
    memcpy(p + FPMI_MSG_FLAGS, &flags, 2);
    memcpy(p + FPMI_MSG_SEQ, &seq, 4);
    memcpy(p + FPMI_MSG_EPOCH, &epoch, 4);
}

/* ---- waiting ----------------------------------------------------------- */

/* signal wakes whoever may sleep on an event whose state was just stored. */
static void signal_event(uint32_t *word, uint32_t *sleepers)
{
    if (load32(sleepers) == 0)
        return;
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void ring_doorbell(struct fpmi_shm *s)
{
    signal_event(u32(s, FPMI_OFF_DOORBELL), u32(s, FPMI_OFF_AGENT_SLEEPERS));
}

/* agent_gone reports whether the agent has vanished: our parent changed,
 * or the PMI_FD socket it holds was hung up. Only called between sleeps. */
static int agent_gone(struct fpmi_shm *s)
{
    if (getppid() != s->ppid)
        return 1;
    if (s->live_fd >= 0) {
        struct pollfd p = {.fd = s->live_fd, .events = POLLIN};
        if (poll(&p, 1, 0) == 1) {
            if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
                return 1;
            char c;
            if ((p.revents & POLLIN) && recv(s->live_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
                return 1;
        }
    }
    return 0;
}

typedef int (*cond_fn)(struct fpmi_shm *s, void *arg);

/* wait_for returns 0 once cond holds, spinning first only when every
 * party has a CPU (shm.NewWaiter), then sleeping on word in slices of
 * 100 ms, checking between them that the agent is still there. */
static int wait_for(struct fpmi_shm *s, uint32_t *word, uint32_t *sleepers, cond_fn cond, void *arg, char *err,
                    size_t errlen)
{
    if (cond(s, arg))
        return 0;
    for (int i = 0; i < s->spins; i++) {
        if (cond(s, arg))
            return 0;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    for (;;) {
        uint32_t seen = load32(word);
        __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
        if (cond(s, arg)) {
            __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
            return 0;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
        __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
        if (cond(s, arg))
            return 0;
        if (agent_gone(s))
            return fail(err, errlen, "the node agent is gone");
    }
}

static int wait_rank(struct fpmi_shm *s, cond_fn cond, void *arg, char *err, size_t errlen)
{
    uint64_t c = ctrl(s);
    return wait_for(s, u32(s, c + FPMI_CTL_RANK_WAKE), u32(s, c + FPMI_CTL_RANK_SLEEPERS), cond, arg, err, errlen);
}

/* ---- request ring (producer) ------------------------------------------- */

/* fits: need bytes free in the request ring; 1 yes, 0 full, -1 corrupt. */
static int fits(struct fpmi_shm *s, uint64_t need)
{
    uint64_t size = s->rq_size;
    if (s->rq_pos - s->rq_head_cache <= size && size - (s->rq_pos - s->rq_head_cache) >= need)
        return 1;
    s->rq_head_cache = load64(u64(s, ctrl(s) + FPMI_CTL_REQ_HEAD)); /* pairs with the agent's Release */
    uint64_t used = s->rq_pos - s->rq_head_cache;
    if (used > size)
        return -1;
    return size - used >= need;
}

struct need {
    uint64_t n;
};

static int has_room(struct fpmi_shm *s, void *arg) { return fits(s, ((struct need *)arg)->n) != 0; }

/* push3_locked sends one request record whose payload is a, b, then c
 * (copied straight into the ring: no allocation); the caller holds wmu. */
static int push3_locked(struct fpmi_shm *s, uint16_t op, uint16_t flags, uint32_t seq, uint32_t epoch, const void *a,
                 size_t an, const void *b, size_t bn, const void *c, size_t cn, char *err, size_t errlen)
{
    uint64_t n = (uint64_t)an + bn + cn;
    if (n > s->rq_size / 2 - FPMI_MSG_HEADER_LEN)
        return fail(err, errlen, "request of %llu bytes exceeds the ring's %llu", (unsigned long long)n,
                    (unsigned long long)(s->rq_size / 2 - FPMI_MSG_HEADER_LEN));
    uint64_t rec = align_up(FPMI_MSG_HEADER_LEN + n, FPMI_RECORD_ALIGN);
    uint64_t off = s->rq_pos & (s->rq_size - 1), pad = 0;
    if (s->rq_size - off < rec)
        pad = s->rq_size - off;
    struct need need = {pad + rec};
    int f = fits(s, need.n);
    if (f < 0)
        return fail(err, errlen, "request ring corrupt: agent at %llu, rank at %llu",
                    (unsigned long long)s->rq_head_cache, (unsigned long long)s->rq_pos);
    if (f == 0 && wait_rank(s, has_room, &need, err, errlen) != 0)
        return -1;
    if (fits(s, need.n) != 1)
        return fail(err, errlen, "request ring corrupt");
    if (pad > 0)
        put_header(s->rq + off, (uint32_t)(pad - FPMI_MSG_HEADER_LEN), FPMI_OP_PAD, 0, 0, 0);
    unsigned char *p = s->rq + ((s->rq_pos + pad) & (s->rq_size - 1));
    put_header(p, (uint32_t)n, op, flags, seq, epoch);
    if (an)
        memcpy(p + FPMI_MSG_HEADER_LEN, a, an);
    if (bn)
        memcpy(p + FPMI_MSG_HEADER_LEN + an, b, bn);
    if (cn)
        memcpy(p + FPMI_MSG_HEADER_LEN + an + bn, c, cn);
    s->rq_pos += pad + rec;
    store64(u64(s, ctrl(s) + FPMI_CTL_REQ_TAIL), s->rq_pos); /* publishes the record */
    __atomic_or_fetch(u64(s, s->l.ready_off + 8 * (uint64_t)(s->local / 64)), (uint64_t)1 << (s->local % 64),
                      __ATOMIC_SEQ_CST);
    ring_doorbell(s);
    return 0;
}

/* push3 under wmu. */
static int push3(struct fpmi_shm *s, uint16_t op, uint16_t flags, uint32_t seq, uint32_t epoch, const void *a,
                 size_t an, const void *b, size_t bn, const void *c, size_t cn, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->wmu);
    int rc = push3_locked(s, op, flags, seq, epoch, a, an, b, bn, c, cn, err, errlen);
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

static int push(struct fpmi_shm *s, uint16_t op, uint16_t flags, uint32_t seq, uint32_t epoch, const void *a, size_t an,
                const void *b, size_t bn, char *err, size_t errlen)
{
    return push3(s, op, flags, seq, epoch, a, an, b, bn, NULL, 0, err, errlen);
}

/* ---- response ring (consumer) ------------------------------------------ */

static int resp_waiting(struct fpmi_shm *s, void *arg)
{
    (void)arg;
    if (s->rs_pos != s->rs_tail_cache)
        return 1;
    s->rs_tail_cache = load64(u64(s, ctrl(s) + FPMI_CTL_RESP_TAIL)); /* pairs with the agent's Commit */
    return s->rs_pos != s->rs_tail_cache;
}

static void keep_error(struct fpmi_shm *s, uint32_t epoch, const unsigned char *msg, size_t n)
{
    int i = s->errs_next;
    s->errs_next = (i + 1) % ERR_EPOCHS;
    s->errs[i].used = 1;
    s->errs[i].epoch = epoch;
    if (n >= sizeof s->errs[i].msg)
        n = sizeof s->errs[i].msg - 1;
    memcpy(s->errs[i].msg, msg, n);
    s->errs[i].msg[n] = '\0';
}

/* drain reads every waiting response, validating each record as
 * shm.Consumer.Peek does: collective errors are kept, the response to
 * request s->seq is copied out. */
static int drain(struct fpmi_shm *s, char *err, size_t errlen)
{
    uint64_t size = s->rs_size;
    for (;;) {
        if (!resp_waiting(s, NULL))
            return 0;
        uint64_t avail = s->rs_tail_cache - s->rs_pos;
        if (avail > size || s->rs_pos % FPMI_RECORD_ALIGN || avail % FPMI_RECORD_ALIGN)
            return fail(err, errlen, "response ring corrupt: agent at %llu, rank at %llu",
                        (unsigned long long)s->rs_tail_cache, (unsigned long long)s->rs_pos);
        uint64_t off = s->rs_pos & (size - 1), skip = 0;
        if (rd16(s->rs + off + FPMI_MSG_OP) == FPMI_OP_PAD) {
            uint64_t room = size - off;
            if ((uint64_t)rd32(s->rs + off + FPMI_MSG_LEN) + FPMI_MSG_HEADER_LEN != room || room >= avail)
                return fail(err, errlen, "response ring corrupt: bad pad record");
            skip = room;
            off = 0;
            avail -= room;
        }
        const unsigned char *h = s->rs + off;
        uint64_t n = rd32(h + FPMI_MSG_LEN);
        uint64_t rec = align_up(FPMI_MSG_HEADER_LEN + n, FPMI_RECORD_ALIGN);
        uint16_t op = rd16(h + FPMI_MSG_OP);
        if (n > size / 2 || rec > avail || off + rec > size || op == FPMI_OP_PAD)
            return fail(err, errlen, "response ring corrupt: %llu-byte record", (unsigned long long)n);
        const unsigned char *payload = h + FPMI_MSG_HEADER_LEN;
        if (op == FPMI_OP_ERROR) {
            keep_error(s, rd32(h + FPMI_MSG_EPOCH), payload, n);
        } else if (rd32(h + FPMI_MSG_SEQ) == s->seq && !s->got) {
            if (n + 1 > s->buf_cap) {
                char *p = realloc(s->buf, n + 1);
                if (p == NULL)
                    return fail(err, errlen, "out of memory");
                s->buf = p;
                s->buf_cap = n + 1;
            }
            memcpy(s->buf, payload, n);
            s->buf[n] = '\0';
            s->buf_len = n;
            s->resp_op = op;
            s->resp_flags = rd16(h + FPMI_MSG_FLAGS);
            s->got = 1;
        }
        s->rs_pos += skip + rec;
        store64(u64(s, ctrl(s) + FPMI_CTL_RESP_HEAD), s->rs_pos); /* hands the bytes back */
        ring_doorbell(s);
    }
}

/* ---- open / close ------------------------------------------------------ */

static int online_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    return CPU_COUNT(&set);
}

/* shm_store is the process's first segment, in .bss (zero): PMI2_Init
 * makes no allocation, whose first use sets up the heap and faults in
 * its pages (tens of microseconds each on a loaded or virtual machine).
 * A second segment open at once is allocated. */
static struct fpmi_shm shm_store;
static int shm_store_used; /* atomic: shm_store belongs to an open segment */

static struct fpmi_shm *shm_alloc(void)
{
    if (!__atomic_exchange_n(&shm_store_used, 1, __ATOMIC_ACQ_REL))
        return &shm_store;
    return calloc(1, sizeof(struct fpmi_shm));
}

static void shm_free(struct fpmi_shm *s)
{
    if (s != &shm_store) {
        free(s);
        return;
    }
    memset(s, 0, sizeof *s);
    __atomic_store_n(&shm_store_used, 0, __ATOMIC_RELEASE);
}

struct fpmi_shm *fpmi_shm_open(int fd, int local, int world, int live_fd, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(err, errlen, "segment descriptor %d: %s", fd, strerror(errno));
        return NULL;
    }
    if (st.st_size < (off_t)FPMI_SHM_HEADER_BYTES || (uint64_t)st.st_size > FPMI_MAX_TOTAL) {
        fail(err, errlen, "descriptor %d of %lld bytes cannot hold a segment", fd, (long long)st.st_size);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    unsigned char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        fail(err, errlen, "map segment: %s", strerror(errno));
        return NULL;
    }
    struct fpmi_shm *s = shm_alloc();
    if (s == NULL) {
        munmap(mem, size);
        fail(err, errlen, "out of memory");
        return NULL;
    }
    s->mem = mem;
    if (fpmi_layout_read(mem, size, &s->l, err, errlen) != 0)
        goto bad;
    if (local < 0 || (uint64_t)local >= s->l.local_ranks || (uint64_t)world != s->l.world_size) {
        fail(err, errlen, "local rank %d of a job of %d; the segment has %llu local ranks of %llu", local, world,
             (unsigned long long)s->l.local_ranks, (unsigned long long)s->l.world_size);
        goto bad;
    }
    s->local = local;
    s->live_fd = live_fd;
    s->ppid = getppid();
    s->spins = s->l.local_ranks + 1 <= (uint64_t)online_cpus() ? (int)FPMI_DEFAULT_SPINS : 0;
    uint64_t ring = s->l.ring_off + (uint64_t)local * s->l.ring_stride;
    s->rq = mem + ring;
    s->rq_size = s->l.req_ring;
    s->rs = mem + ring + s->l.req_ring;
    s->rs_size = s->l.resp_ring;
    uint64_t c = ctrl(s);
    s->rq_pos = load64(u64(s, c + FPMI_CTL_REQ_TAIL));
    s->rq_head_cache = load64(u64(s, c + FPMI_CTL_REQ_HEAD));
    s->rs_pos = load64(u64(s, c + FPMI_CTL_RESP_HEAD));
    s->rs_tail_cache = s->rs_pos;
    if (s->rq_pos % FPMI_RECORD_ALIGN || s->rq_pos - s->rq_head_cache > s->rq_size) {
        fail(err, errlen, "request ring of local rank %d is corrupt", local);
        goto bad;
    }
    /* The Go client's Rank.Announce: the pid, then the state publishing it. */
    store32(u32(s, c + FPMI_CTL_RANK_PID), (uint32_t)getpid());
    store32(u32(s, c + FPMI_CTL_RANK_STATE), FPMI_RANK_ATTACHED);
    if (push(s, FPMI_OP_HELLO, 0, 0, 0, NULL, 0, NULL, 0, err, errlen) != 0)
        goto bad;
    return s;
bad:
    munmap(mem, size);
    shm_free(s);
    return NULL;
}

void fpmi_shm_close(struct fpmi_shm *s)
{
    if (s == NULL)
        return;
    munmap(s->mem, s->l.total);
    free(s->buf);
    shm_free(s);
}

int fpmi_shm_max_value(const struct fpmi_shm *s) { return (int)s->l.max_value; }

/* ---- operations -------------------------------------------------------- */

int fpmi_shm_put(struct fpmi_shm *s, const char *key, const char *val, size_t vlen, int hint, char *err, size_t errlen)
{
    size_t kl = strlen(key);
    unsigned char hdr[2] = {(unsigned char)(kl & 0xff), (unsigned char)(kl >> 8)};
    return push3(s, FPMI_OP_PUT, (uint16_t)hint, 0, 0, hdr, 2, key, kl, val, vlen, err, errlen);
}

/* next_epoch is the epoch this rank's next collective has, the agent's
 * count of the collectives it entered or skipped: the agent moves a rank
 * past a failed epoch it never entered (a deadlock failed it while the
 * rank waited for a key, say), and publishes that epoch before it answers
 * the rank's failed call. Every epoch published beyond s->colls is such a
 * one, since none completes without this rank; the next is the one after
 * the last published. */
static uint32_t next_epoch(struct fpmi_shm *s)
{
    uint32_t pub = load32(u32(s, FPMI_OFF_EPOCH)); /* pairs with the agent's Publish */
    uint32_t e = s->colls + 1;
    return reached(pub, e) ? pub + 1 : e;
}

uint32_t fpmi_shm_next_epoch(struct fpmi_shm *s) { return next_epoch(s); }

int fpmi_shm_start_fence(struct fpmi_shm *s, int detached, uint32_t *epoch, char *err, size_t errlen)
{
    uint32_t e = next_epoch(s);
    if (push(s, FPMI_OP_FENCE, detached ? FPMI_COLL_DETACHED : 0, 0, e, NULL, 0, NULL, 0, err, errlen) != 0)
        return -1;
    s->colls = e;
    *epoch = e;
    return 0;
}

static int epoch_reached(struct fpmi_shm *s, void *arg)
{
    return reached(load32(u32(s, FPMI_OFF_EPOCH)), *(uint32_t *)arg); /* pairs with the agent's Publish */
}

static int wait_epoch(struct fpmi_shm *s, uint32_t e, char *err, size_t errlen)
{
    return wait_for(s, u32(s, FPMI_OFF_EPOCH_WAKE), u32(s, FPMI_OFF_EPOCH_SLEEPERS), epoch_reached, &e, err, errlen);
}

int fpmi_shm_start_allgather(struct fpmi_shm *s, const void *val, size_t n, int detached, uint32_t *epoch, char *err,
                             size_t errlen)
{
    uint32_t e = next_epoch(s);
    if (n > s->l.max_value)
        return fail(err, errlen, "allgather value of %zu bytes exceeds %llu", n, (unsigned long long)s->l.max_value);
    /* The slot of epoch e is reused from e-2: wait until that is published. */
    if ((s->colls >= 2 || e > 2) && wait_epoch(s, e - 2, err, errlen) != 0)
        return -1;
    unsigned char *slot = s->mem + s->l.slot_off + (2 * (uint64_t)s->local + (e & 1)) * s->l.slot_bytes;
    uint32_t len = (uint32_t)n;
    memcpy(slot + FPMI_SLOT_DATA, val, n);
    memcpy(slot + FPMI_SLOT_LEN, &len, 4);
    memcpy(slot + FPMI_SLOT_EPOCH, &e, 4);
    if (push(s, FPMI_OP_ALLGATHER, detached ? FPMI_COLL_DETACHED : 0, 0, e, NULL, 0, NULL, 0, err, errlen) !=
        0) /* publishes the slot */
        return -1;
    s->colls = e;
    *epoch = e;
    return 0;
}

int fpmi_shm_will_wait(struct fpmi_shm *s, uint32_t epoch, char *err, size_t errlen)
{
    if (epoch_reached(s, &epoch))
        return 0;
    return push(s, FPMI_OP_BLOCK, 0, 0, epoch, NULL, 0, NULL, 0, err, errlen);
}

int fpmi_shm_done(struct fpmi_shm *s, uint32_t epoch, int wait, char *err, size_t errlen)
{
    if (!epoch_reached(s, &epoch)) {
        if (!wait)
            return 0;
        if (wait_epoch(s, epoch, err, errlen) != 0)
            return -1;
    }
    /* An OpError for a failed epoch is pushed before the epoch is
     * published: read it now. */
    if (drain(s, err, errlen) != 0)
        return -1;
    for (int i = 0; i < ERR_EPOCHS; i++)
        if (s->errs[i].used && s->errs[i].epoch == epoch) {
            fail(err, errlen, "%s", s->errs[i].msg);
            return -2;
        }
    return 1;
}

int fpmi_shm_result(struct fpmi_shm *s, int g, uint32_t epoch, const char **v, size_t *n)
{
    if (g < 0 || (uint64_t)g >= s->l.world_size || !epoch_reached(s, &epoch))
        return -1;
    const unsigned char *e =
        s->mem + s->l.result_off + (uint64_t)(epoch & 1) * s->l.result_buf_bytes + (uint64_t)g * s->l.result_stride;
    uint32_t len = rd32(e + FPMI_RES_LEN);
    if (rd32(e + FPMI_RES_EPOCH) != epoch || len > s->l.max_value)
        return -1;
    *v = (const char *)e + FPMI_RES_DATA;
    *n = len;
    return 0;
}

static uint64_t fnv1a(const char *b, size_t n)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int fpmi_shm_lookup(struct fpmi_shm *s, const char *key, size_t klen, const char **v, size_t *n)
{
    uint32_t pub = load32(u32(s, FPMI_OFF_EPOCH)); /* entries tagged up to pub are visible */
    uint64_t h = fnv1a(key, klen), mask = s->l.kvs_buckets - 1, b = h & mask;
    for (uint64_t i = 0; i < s->l.kvs_buckets; i++, b = (b + 1) & mask) {
        uint64_t x = load32(u32(s, s->l.kvs_index_off + 4 * b)); /* pairs with the agent's bucket Store */
        if (x == 0)
            return 0;
        if (x > s->l.kvs_cap)
            continue; /* a tombstone, or garbage: never followed */
        const unsigned char *e = s->mem + s->l.kvs_entry_off + (x - 1) * FPMI_KVS_ENTRY_BYTES;
        uint64_t kl = rd32(e + FPMI_KVS_KEY_LEN), vl = rd32(e + FPMI_KVS_VAL_LEN), at;
        if (rd32(e + FPMI_KVS_HASH) != (uint32_t)h || kl != klen)
            continue;
        memcpy(&at, e + FPMI_KVS_DATA, 8);
        if (kl > s->l.kvs_key_max || vl > s->l.max_value || at > s->l.kvs_arena || kl + vl > s->l.kvs_arena - at)
            continue;
        const char *a = (const char *)s->mem + s->l.kvs_arena_off + at;
        if (memcmp(a, key, klen) != 0)
            continue;
        if (!reached(pub, rd32(e + FPMI_KVS_EPOCH)))
            return 0;
        *v = a + kl;
        *n = vl;
        return 1;
    }
    return 0;
}

static int got_resp(struct fpmi_shm *s, void *arg)
{
    (void)arg;
    return s->got || resp_waiting(s, NULL);
}

int fpmi_shm_call(struct fpmi_shm *s, uint16_t op, uint16_t flags, const void *a, size_t an, const void *b, size_t bn,
                  uint16_t *status, const char **resp, size_t *rlen, char *err, size_t errlen)
{
    s->seq++;
    s->got = 0;
    if (push(s, op, flags, s->seq, 0, a, an, b, bn, err, errlen) != 0)
        return -1;
    for (;;) {
        if (drain(s, err, errlen) != 0)
            return -1;
        if (s->got)
            break;
        if (wait_rank(s, got_resp, NULL, err, errlen) != 0)
            return -1;
    }
    if (s->resp_op != op)
        return fail(err, errlen, "response op %u to request op %u", s->resp_op, op);
    if (s->resp_flags == FPMI_STATUS_ERROR) {
        fail(err, errlen, "%s", s->buf);
        return 1; /* refused by the agent */
    }
    *status = s->resp_flags;
    *resp = s->buf;
    *rlen = s->buf_len;
    return 0;
}

int fpmi_shm_abort(struct fpmi_shm *s, int code, const char *msg)
{
    char err[64];
    unsigned char c[4];
    uint32_t v = (uint32_t)code;
    memcpy(c, &v, 4);
    size_t n = strnlen(msg, FPMI_ABORT_MSG_MAX);
    /* Called without the API's mutex: wmu alone orders this push with
     * another thread's. A push holds wmu only while it waits for ring
     * space, so the wait for it is bounded: an abort that cannot be sent
     * within a second is dropped (the caller exits with code 1 anyway). */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec++;
    if (pthread_mutex_timedlock(&s->wmu, &until) != 0)
        return -1;
    int rc = push3_locked(s, FPMI_OP_ABORT, 0, 0, 0, c, 4, msg, n, NULL, 0, err, sizeof err);
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

int fpmi_shm_finalize(struct fpmi_shm *s, char *err, size_t errlen)
{
    uint16_t st;
    const char *r;
    size_t n;
    if (fpmi_shm_call(s, FPMI_OP_FINALIZE, 0, NULL, 0, NULL, 0, &st, &r, &n, err, errlen) != 0)
        return -1;
    store32(u32(s, ctrl(s) + FPMI_CTL_RANK_STATE), FPMI_RANK_FINALIZED);
    return 0;
}
