/* pmi2.c: Slurm's PMI-2 API (<slurm/pmi2.h>) and fastpmi's extensions
 * (fastpmi/pmi2ext.h) over the transport PMI2_Init chose:
 *
 *   shm        FASTPMI_SHM_FD names the node's segment (pmirun): every
 *              operation goes through the segment's rings; fenced keys
 *              and allgather results are read in place. job-connect and
 *              job-disconnect, which the segment protocol does not carry,
 *              go over the PMI_FD socket beside it (bound to this rank by
 *              the agent, no handshake needed).
 *   pmi2       PMI_FD or PMI_PORT only (Hydra, Slurm, pmirun --shm=false),
 *              or a segment that was refused (corrupt, foreign, another
 *              layout version): the PMI-2 text protocol; extensions are
 *              native against fastpmi's agent (fullinit says fastpmi=1)
 *              and emulated with put/fence/get elsewhere, where
 *              collectives also run one at a time.
 *   singleton  no launcher: rank 0 of 1 with a process-local KVS.
 *
 * Thread safety: every entry point takes one mutex, so calls from several
 * threads are serialised (libpmi2's promise); a blocking call holds it.
 * PMI2_Abort does not wait for it: it sends the abort through the
 * transport's own write lock (shm.c, text.c), sets aborted and exits;
 * every call after that fails at once. Nor do PMI2_Initialized,
 * PMI2_Job_GetRank and PMI2_Info_GetSize, which read ident: a watchdog
 * thread that asks them before it aborts a hung call must get an answer,
 * as from Slurm's library. */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <slurm/pmi2.h>

#include "fastpmi/pmi2ext.h"
#include "fpmi.h"

#define EXPORT __attribute__((visibility("default")))

_Static_assert(PMIX_MAX_VALLEN == PMI2_MAX_VALLEN, "PMIX_MAX_VALLEN is PMI-2's value limit");

enum kind { T_NONE, T_SHM, T_TEXT, T_SINGLETON };

/* A key-value pair of the singleton's KVS and node attributes. */
struct kv {
    char *key, *val;
    struct kv *next;
};

/* A text-protocol allgather result kept for PMIX_View_get. */
struct tview {
    int n;
    char **vals;
    size_t *lens;
};

/* g is the library's state, guarded by mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int init; /* PMI2_Init succeeded and PMI2_Finalize has not run */
    enum kind kind;
    struct fpmi_shm *shm;
    struct fpmi_text *text; /* the PMI_FD socket: the transport (T_TEXT), or beside shm */
    int rank, size, appnum, spawned;
    char jobid[256];
    int ext;   /* T_TEXT: the launcher answers fastpmi's extensions */
    /* T_TEXT: the launcher is Hydra (neither fastpmi's nor Slurm's), whose
     * PMI-2 server ends the whole job on a kvs-get from a rank that has
     * not fenced yet (it asserts the rank's fence epoch exists): until
     * fenced, get_locked refuses rather than ask. */
    int hydra, fenced;
    int nag;   /* T_TEXT without extensions: allgathers emulated so far */
    struct kv *kvs, *nodeattrs, *names; /* T_SINGLETON: process-local */
    struct tview *views[2];     /* T_TEXT, and T_SHM views copied out: the last two */
    unsigned nviews;            /* copies made; stored atomically, read by PMIX_View_get without mu */
    struct PMIX_Request_s *pending; /* T_SHM: allgathers not yet waited for, oldest first */
    struct PMIX_Request_s *live;    /* requests handed out and not yet waited for, newest first */
    uintptr_t handles;              /* the last request handle handed out */
    char err[512];
    int errset; /* seterr ran in the current call (cleared by LOCK) */
} g;

/* ident publishes PMI2_Init's result to the calls that do not wait for mu
 * (PMI2_Initialized, PMI2_Job_GetRank, PMI2_Info_GetSize): 0 before
 * PMI2_Init succeeds and after PMI2_Finalize, else IDENT_INIT | size << 32
 * | rank (its 32 bits). Stored under mu, loaded without it; the word
 * carries all it publishes, so relaxed order suffices. */
static uint64_t ident;
#define IDENT_INIT ((uint64_t)1 << 63)

/* aborted is set (atomically, without mu) by PMI2_Abort: every entry point
 * then fails at once instead of waiting for mu, which a thread blocked in
 * a call may hold until the job ends. */
static int aborted;

/* forked is set (atomically, by a pthread_atfork handler PMI2_Init
 * registers) in a child forked after PMI2_Init. The segment's rings and
 * counters are the parent's: a request the child pushed would overwrite
 * the parent's and end the job as a broken protocol. The child's next
 * call moves it to the text protocol on the PMI_FD socket it shares with
 * the parent, as Slurm's library's child shares it (leave_segment). The
 * rank stays the parent's: the child's PMI2_Finalize finalizes nothing. */
static int forked;

static void on_fork_child(void) { __atomic_store_n(&forked, 1, __ATOMIC_RELAXED); }

static int leave_segment(void);
static int serialize(void);

struct PMIX_Request_s {
    int allgather;
    int detached;           /* started by PMIX_Iallgather or PMIX_KVS_Ifence (tell_waiting) */
    uint32_t epoch;         /* T_SHM */
    struct fpmi_treq *tr;   /* T_TEXT */
    int agnum;              /* T_TEXT emulated allgather: its number */
    void *buffer;           /* allgather destination */
    struct tview *view;     /* allgather into a view instead of a buffer */
    PMIX_View *outview;     /* a zero-copy allgather's view, filled at completion */
    char *sval;             /* T_SINGLETON allgather value, a copy */
    size_t slen;
    /* T_SHM allgather: in g.pending until harvested or waited for. Its
     * results sit in the segment's two-deep result array only until the
     * rank starts the allgather two epochs later, so one still outstanding
     * then is completed and copied out first (harvest): done is set and
     * rc is what PMIX_Wait returns. */
    struct PMIX_Request_s *next;
    int done, rc;
    /* A request PMIX_Iallgather, PMIX_Iallgather_view or PMIX_KVS_Ifence
     * handed out is in g.live until PMIX_Wait takes it back. Its handle is
     * a serial, never its address: a handle waited for already names no
     * request, not one a later start reused the memory of. */
    uintptr_t handle;
    struct PMIX_Request_s *live_next;
};

/* seterr formats into g.err. Callers pass g.err itself as an argument
 * (the transport's message, wrapped): it is formatted into a copy first,
 * as vsnprintf's destination must not overlap its arguments. */
static void seterr(const char *fmt, ...)
{
    char msg[sizeof g.err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(g.err, msg, sizeof msg);
    g.errset = 1;
    if (getenv("FASTPMI_DEBUG") != NULL)
        fprintf(stderr, "libfastpmi: rank %d: %s\n", g.rank, g.err);
}

/* rc_text says what a return code means, for the reason of a call that
 * failed without one of its own (an argument refused before sending). */
static const char *rc_text(int rc)
{
    switch (rc) {
    case PMI2_ERR_INIT:
        return "PMI2_ERR_INIT: not initialised (before PMI2_Init, or after PMI2_Finalize)";
    case PMI2_ERR_NOMEM:
        return "PMI2_ERR_NOMEM: out of memory";
    case PMI2_ERR_INVALID_ARG:
        return "PMI2_ERR_INVALID_ARG: an argument is NULL or out of range";
    case PMI2_ERR_INVALID_KEY:
        return "PMI2_ERR_INVALID_KEY: the key is NULL or empty";
    case PMI2_ERR_INVALID_KEY_LENGTH:
        return "PMI2_ERR_INVALID_KEY_LENGTH: the key or name is too long";
    case PMI2_ERR_INVALID_VAL:
        return "PMI2_ERR_INVALID_VAL: the value is NULL, or its buffer has no room";
    case PMI2_ERR_INVALID_VAL_LENGTH:
        return "PMI2_ERR_INVALID_VAL_LENGTH: the value is too long";
    case PMI2_ERR_INVALID_LENGTH:
        return "PMI2_ERR_INVALID_LENGTH: the name or port is too long";
    default:
        return "failed";
    }
}

/* LOCK takes mu for an entry point; RETURN releases it, and a failure
 * without a reason of its own gets rc_text's, named by the entry point
 * (seen with FASTPMI_DEBUG). */
#define LOCK()                                                                                                         \
    do {                                                                                                               \
        if (__atomic_load_n(&aborted, __ATOMIC_ACQUIRE))                                                               \
            return PMI2_FAIL;                                                                                          \
        pthread_mutex_lock(&mu);                                                                                       \
        g.errset = 0;                                                                                                  \
    } while (0)
#define RETURN(rc)                                                                                                     \
    do {                                                                                                               \
        int rc_ = (rc);                                                                                                \
        if (rc_ != PMI2_SUCCESS && !g.errset)                                                                          \
            seterr("%s: %s", __func__, rc_text(rc_));                                                                  \
        pthread_mutex_unlock(&mu);                                                                                     \
        return rc_;                                                                                                    \
    } while (0)
#define NEED_INIT()                                                                                                    \
    do {                                                                                                               \
        if (!g.init)                                                                                                   \
            RETURN(PMI2_ERR_INIT);                                                                                     \
        if (__atomic_load_n(&forked, __ATOMIC_RELAXED) && g.kind == T_SHM && leave_segment() != PMI2_SUCCESS)          \
            RETURN(PMI2_FAIL);                                                                                         \
    } while (0)

/* env_int reads a decimal from -1 to 2^30 (no sign but '-', no spaces):
 * digits by hand, as strtol's first call faults in libc's locale tables
 * at PMI2_Init. A value that is none sets *bad to name, unless an
 * earlier variable's did, and gives dflt. */
static int env_int(const char *name, int dflt, const char **bad)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return dflt;
    int neg = *s == '-';
    const char *p = s + neg;
    long v = 0;
    for (; *p >= '0' && *p <= '9' && v <= 1 << 30; p++)
        v = v * 10 + (*p - '0');
    if (neg)
        v = -v;
    if (*p != '\0' || p == s + neg || v < -1 || v > 1 << 30) {
        if (*bad == NULL)
            *bad = name;
        return dflt;
    }
    return (int)v;
}

/* env_set reports whether the launcher set name (to anything but ""). */
static int env_set(const char *name)
{
    const char *s = getenv(name);
    return s != NULL && *s != '\0';
}

/* copy_out copies n bytes of v into buf[max] with a NUL: 0, or -1 if it
 * was truncated. */
static int copy_out(char *buf, int max, const char *v, size_t n)
{
    if (max <= 0)
        return -1;
    size_t k = n < (size_t)max - 1 ? n : (size_t)max - 1;
    memcpy(buf, v, k);
    buf[k] = '\0';
    return k == n ? 0 : -1;
}

/* set_jobid copies id into g.jobid, truncated (no printf in PMI2_Init:
 * its first call faults in libc's formatting code). */
static void set_jobid(const char *id) { (void)copy_out(g.jobid, (int)sizeof g.jobid, id, strlen(id)); }

/* ---- text helpers ------------------------------------------------------ */

static struct fpmi_buf wb;

/* tcall sends wb (started with cmd) and waits: PMI2_SUCCESS,
 * PMI2_ERR_OTHER if the server refused it, or PMI2_FAIL if the connection
 * failed. */
static int tcall(const char *cmd, struct fpmi_treq **out)
{
    struct fpmi_treq *r;
    *out = NULL;
    if (g.text == NULL) {
        seterr("%s needs the PMI_FD connection, which this launcher did not give", cmd);
        return PMI2_FAIL;
    }
    if (fpmi_text_call(g.text, &wb, cmd, &r, g.err, sizeof g.err) != 0) {
        seterr("%s: %s", cmd, g.err);
        return PMI2_FAIL;
    }
    if (r->rc != 0) {
        /* The server's rc is a wire code, not a PMI2_ERR_* (Hydra's 1 is
         * not PMI2_ERR_INIT): a refusal is PMI2_ERR_OTHER, as Slurm's
         * library returns. */
        const char *m = fpmi_msg_get(&r->resp, "errmsg", NULL);
        seterr("%s failed (rc=%d): %s", cmd, r->rc, m ? m : "");
        fpmi_treq_free(r);
        return PMI2_ERR_OTHER;
    }
    *out = r;
    return PMI2_SUCCESS;
}

/* shm_rc is the code of a failed fpmi_shm_call (c, 1 or -1): a request
 * the agent refused is PMI2_ERR_OTHER, as tcall returns for the text
 * protocol's (and Slurm's library for any), a failed exchange PMI2_FAIL. */
static int shm_rc(int c) { return c == 1 ? PMI2_ERR_OTHER : PMI2_FAIL; }

/* tcall_found runs a request answered with found=TRUE|FALSE and value
 * (info-getnodeattr, info-getjobattr): the value into value[valuelen]. */
static int tcall_found(const char *cmd, char *value, int valuelen, int *found)
{
    struct fpmi_treq *r;
    int rc = tcall(cmd, &r);
    if (rc != PMI2_SUCCESS)
        return rc;
    const char *f = fpmi_msg_get(&r->resp, "found", NULL);
    size_t n = 0;
    const char *v = fpmi_msg_get(&r->resp, "value", &n);
    if (f != NULL && strcmp(f, "TRUE") == 0 && v != NULL) {
        *found = 1;
        copy_out(value, valuelen, v, n);
    }
    fpmi_treq_free(r);
    return PMI2_SUCCESS;
}

static int connect_port(const char *hp)
{
    char host[256];
    const char *c = strrchr(hp, ':');
    if (c == NULL || (size_t)(c - hp) >= sizeof host)
        return -1;
    memcpy(host, hp, (size_t)(c - hp));
    host[c - hp] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai, *p;
    if (getaddrinfo(host, c + 1, &hints, &ai) != 0)
        return -1;
    int fd = -1;
    for (p = ai; p != NULL; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd >= 0 && connect(fd, p->ai_addr, p->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    /* Requests are whole frames, and one is often written while another
     * awaits its answer (PMIX_Wait's fastpmi-block behind an ifence):
     * Nagle's algorithm would hold it until the server's delayed ack
     * (40 ms). Slurm's library sets it too. */
    int one = 1;
    if (fd >= 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int init_text(int fd)
{
    g.text = fpmi_text_open(fd);
    if (g.text == NULL)
        return PMI2_ERR_NOMEM;
    const char *id = getenv("PMI_ID");
    if (id == NULL)
        id = getenv("PMI_RANK");
    struct fpmi_treq *r;
    if (fpmi_text_init(g.text, id, getenv("PMI_JOBID"), &r, g.err, sizeof g.err) != 0) {
        seterr("PMI-2 init: %s", g.err);
        fpmi_text_close(g.text);
        g.text = NULL;
        return PMI2_FAIL;
    }
    const char *rank = fpmi_msg_get(&r->resp, "rank", NULL), *size = fpmi_msg_get(&r->resp, "size", NULL);
    const char *appnum = fpmi_msg_get(&r->resp, "appnum", NULL), *ext = fpmi_msg_get(&r->resp, "fastpmi", NULL);
    if (rank == NULL || size == NULL || atoi(size) < 1) {
        seterr("fullinit-response without rank and size");
        fpmi_treq_free(r);
        fpmi_text_close(g.text);
        g.text = NULL;
        return PMI2_FAIL;
    }
    g.rank = atoi(rank);
    g.size = atoi(size);
    g.appnum = appnum ? atoi(appnum) : 0;
    g.spawned = fpmi_msg_get(&r->resp, "spawner-jobid", NULL) != NULL;
    g.ext = ext != NULL && strcmp(ext, "1") == 0;
    g.hydra = !g.ext && getenv("SLURM_STEP_ID") == NULL;
    fpmi_treq_free(r);
    fpmi_buf_start(&wb, "job-getid");
    if (tcall("job-getid", &r) == PMI2_SUCCESS) {
        const char *j = fpmi_msg_get(&r->resp, "jobid", NULL);
        if (j != NULL)
            snprintf(g.jobid, sizeof g.jobid, "%s", j);
        fpmi_treq_free(r);
    }
    g.kind = T_TEXT;
    return PMI2_SUCCESS;
}

/* leave_segment moves a child forked after PMI2_Init (forked) from the
 * parent's segment to the text protocol on PMI_FD, which the agent has
 * bound to the rank (no handshake) and which answers fastpmi's extensions.
 * The segment stays mapped: views the parent made stay readable. Without
 * PMI_FD (pmirun --pmi-port) the child has no channel of its own, and
 * every call fails. */
static int leave_segment(void)
{
    if (g.text == NULL) {
        seterr("process %d was forked after PMI2_Init: the segment is its parent's, and without PMI_FD it has no "
               "connection of its own",
               (int)getpid());
        return PMI2_FAIL;
    }
    g.kind = T_TEXT;
    g.ext = 1;
    /* The requests outstanding at the fork are the parent's collectives,
     * which only the segment completes: waiting for one here fails. */
    g.pending = NULL;
    for (struct PMIX_Request_s *q = g.live; q != NULL; q = q->live_next)
        if (!q->done) {
            q->done = 1;
            q->rc = PMI2_FAIL;
        }
    return PMI2_SUCCESS;
}

/* ---- PMI-2 API --------------------------------------------------------- */

EXPORT int PMI2_Init(int *spawned, int *size, int *rank, int *appnum)
{
    LOCK();
    if (g.init) {
        if (spawned)
            *spawned = g.spawned;
        if (size)
            *size = g.size;
        if (rank)
            *rank = g.rank;
        if (appnum)
            *appnum = g.appnum;
        RETURN(PMI2_SUCCESS);
    }
    g.kind = T_NONE; /* a second PMI2_Init after PMI2_Finalize starts over */
    const char *bad = NULL;
    g.rank = env_int("PMI_RANK", 0, &bad);
    g.size = env_int("PMI_SIZE", 1, &bad);
    int local = env_int("MPI_LOCALRANKID", g.rank, &bad);
    int pmifd = env_int("PMI_FD", -1, &bad);
    int shmfd = env_int("FASTPMI_SHM_FD", -1, &bad);
    g.appnum = env_int("FASTPMI_APPNUM", 0, &bad);
    g.spawned = env_int("PMI_SPAWNED", 0, &bad) == 1;
    const char *j = getenv("PMI_JOBID");
    set_jobid(j ? j : "");
    if (bad != NULL) {
        seterr("bad PMI environment: %s=%s is not a number from -1 to 1073741824", bad, getenv(bad));
        fprintf(stderr, "libfastpmi: %s\n", g.err);
        RETURN(PMI2_ERR_INVALID_ARG);
    }
    /* FASTPMI_TRANSPORT=shm refuses to start without the segment;
     * FASTPMI_TRANSPORT=pmi2 ignores it and speaks the text protocol. */
    const char *want = getenv("FASTPMI_TRANSPORT");
    if (want != NULL && *want != '\0' && strcmp(want, "shm") != 0 && strcmp(want, "pmi2") != 0) {
        fprintf(stderr, "libfastpmi: FASTPMI_TRANSPORT=%s: want shm or pmi2\n", want);
        RETURN(PMI2_ERR_INVALID_ARG);
    }
    if (want != NULL && strcmp(want, "pmi2") == 0) {
        if (shmfd >= 0)
            close(shmfd);
        shmfd = -1;
    }
    int rc = PMI2_SUCCESS;
    char refused[sizeof g.err] = ""; /* why the segment was refused, said once the rank is known */
    if (shmfd >= 0) {
        /* The segment does not say which rank this process is: PMI_RANK
         * and MPI_LOCALRANKID do. Without them the defaults (rank 0, its
         * ring) would be another rank's, so the launcher is asked over
         * PMI_FD (or PMI_PORT) instead. */
        if (!env_set("PMI_RANK") || !env_set("MPI_LOCALRANKID"))
            fpmi_errf(refused, sizeof refused,
                      "PMI_RANK or MPI_LOCALRANKID is not set, and the segment alone does not say which rank this is");
        else if ((g.shm = fpmi_shm_open(shmfd, local, g.size, pmifd, g.err, sizeof g.err)) == NULL)
            memcpy(refused, g.err, sizeof refused);
        close(shmfd); /* the mapping keeps the memory */
        if (g.shm != NULL) {
            g.kind = T_SHM;
            if (pmifd >= 0)
                g.text = fpmi_text_open(pmifd);
        } else if (pmifd < 0 && !env_set("PMI_PORT")) { /* no text protocol to fall back to */
            fprintf(stderr, "libfastpmi: rank %d: shared memory refused (%s)\n", g.rank, refused);
            RETURN(PMI2_FAIL);
        }
    }
    if (want != NULL && strcmp(want, "shm") == 0 && g.kind != T_SHM) {
        if (shmfd < 0)
            fprintf(stderr, "libfastpmi: rank %d: FASTPMI_TRANSPORT=shm but the launcher gave no segment "
                    "(FASTPMI_SHM_FD)\n", g.rank);
        else
            fprintf(stderr, "libfastpmi: rank %d: FASTPMI_TRANSPORT=shm but the segment was refused (%s)\n", g.rank,
                    refused);
        RETURN(PMI2_FAIL);
    }
    if (g.kind == T_NONE) {
        const char *port = getenv("PMI_PORT");
        if (pmifd >= 0) {
            rc = init_text(pmifd);
        } else if (port != NULL && *port != '\0') {
            int fd = connect_port(port);
            rc = fd < 0 ? PMI2_FAIL : init_text(fd);
            if (fd < 0)
                seterr("connect to PMI_PORT=%s failed", port);
        } else {
            g.kind = T_SINGLETON;
            g.rank = 0;
            g.size = 1;
            if (g.jobid[0] == '\0')
                set_jobid("singleton");
        }
    }
    if (refused[0] != '\0')
        fprintf(stderr, "libfastpmi: rank %d: shared memory refused (%s); using the PMI-2 text protocol\n", g.rank,
                refused);
    if (rc != PMI2_SUCCESS) {
        fprintf(stderr, "libfastpmi: rank %d: %s\n", g.rank, g.err);
        RETURN(rc);
    }
    if (g.jobid[0] == '\0')
        set_jobid("job");
    g.init = 1;
    if (g.kind != T_SINGLETON) {
        static int registered; /* under mu */
        if (!registered)
            registered = pthread_atfork(NULL, NULL, on_fork_child) == 0;
    }
    __atomic_store_n(&ident, IDENT_INIT | (uint64_t)(uint32_t)g.size << 32 | (uint32_t)g.rank, __ATOMIC_RELAXED);
    if (spawned)
        *spawned = g.spawned;
    if (size)
        *size = g.size;
    if (rank)
        *rank = g.rank;
    if (appnum)
        *appnum = g.appnum;
    RETURN(PMI2_SUCCESS);
}

EXPORT int PMI2_Finalize(void)
{
    LOCK();
    if (g.init && __atomic_load_n(&forked, __ATOMIC_RELAXED)) {
        /* A child forked after PMI2_Init: the rank is its parent's to
         * finalize (a finalize from here would end the parent's use of
         * it); the child only stops using the library. */
        if (g.text != NULL) {
            fpmi_text_close(g.text); /* the child's copy of the descriptor */
            g.text = NULL;
        }
        g.init = 0;
        __atomic_store_n(&ident, 0, __ATOMIC_RELAXED);
        RETURN(PMI2_SUCCESS);
    }
    NEED_INIT();
    int rc = PMI2_SUCCESS;
    struct fpmi_treq *r;
    switch (g.kind) {
    case T_SHM:
        if (fpmi_shm_finalize(g.shm, g.err, sizeof g.err) != 0) {
            seterr("finalize: %s", g.err);
            rc = PMI2_FAIL;
        }
        /* The segment stays mapped: views handed out stay readable until
         * the process ends. */
        break;
    case T_TEXT:
        /* A server other than fastpmi's must not get finalize while a
         * collective is outstanding (PMIX_KVS_Ifence, PMIX_Iallgather not
         * waited for): Hydra's proxy fails the job writing the fence's
         * answer to a rank that finalized. Those complete first. */
        if ((rc = serialize()) != PMI2_SUCCESS)
            break;
        fpmi_buf_start(&wb, "finalize");
        rc = tcall("finalize", &r);
        fpmi_treq_free(r);
        break;
    default:
        break;
    }
    if (g.text != NULL) {
        fpmi_text_close(g.text);
        g.text = NULL;
    }
    g.init = 0;
    __atomic_store_n(&ident, 0, __ATOMIC_RELAXED);
    RETURN(rc);
}

/* ident_load loads ident into *id for a call that does not wait for mu:
 * PMI2_SUCCESS, or what LOCK and NEED_INIT return in its place. */
static int ident_load(uint64_t *id)
{
    if (__atomic_load_n(&aborted, __ATOMIC_ACQUIRE))
        return PMI2_FAIL;
    *id = __atomic_load_n(&ident, __ATOMIC_RELAXED);
    return *id != 0 ? PMI2_SUCCESS : PMI2_ERR_INIT;
}

EXPORT int PMI2_Initialized(void)
{
    uint64_t id;
    return ident_load(&id) == PMI2_SUCCESS;
}

/* PMI2_Abort sends the abort and exits at once, as Slurm's library does.
 * It does not wait for mu: another thread may hold it, blocked in a call
 * that only the abort would end. If mu is free it is taken so that the
 * state cannot change under the send; otherwise the state read is the
 * one the blocked call runs on (g.init, g.kind, g.shm and g.text change
 * only in PMI2_Init and PMI2_Finalize), and the send goes through the
 * transport's write lock alone, which no call holds while it waits for
 * an answer. mu is released before exit: atexit handlers and other
 * threads calling the library fail at once (aborted). */
EXPORT int PMI2_Abort(int flag, const char msg[])
{
    int locked = pthread_mutex_trylock(&mu) == 0;
    int first = !__atomic_exchange_n(&aborted, 1, __ATOMIC_ACQ_REL);
    if (msg == NULL)
        msg = "";
    if (first && g.init) {
        if (g.kind == T_SHM && !__atomic_load_n(&forked, __ATOMIC_RELAXED)) {
            fpmi_shm_abort(g.shm, 1, msg);
        } else if (g.kind == T_TEXT && g.hydra && g.text != NULL) {
            /* Hydra's PMI-2 has no abort command (mpiexec ends the job
             * with 255 on one, the message lost); it reads PMI-1's on the
             * same connection, as the Go client sends it. A PMI-1 value
             * holds no space or LF: '_' instead, as Slurm does. */
            char line[PMI2_MAX_VALLEN + 64];
            int n = snprintf(line, sizeof line, "cmd=abort exitcode=1 error_msg=%.*s", PMI2_MAX_VALLEN, msg);
            if (n > (int)sizeof line - 2)
                n = (int)sizeof line - 2;
            for (char *c = line + strlen("cmd=abort exitcode=1 error_msg="); c < line + n; c++)
                if (*c == ' ' || *c == '\n' || *c == '\r')
                    *c = '_';
            line[n++] = '\n';
            fpmi_text_write_raw(g.text, line, (size_t)n);
        } else if (g.kind != T_SINGLETON && g.text != NULL) {
            struct fpmi_buf b = {0};
            fpmi_buf_start(&b, "abort");
            fpmi_buf_pairs(&b, "isworld", flag ? "TRUE" : "FALSE");
            fpmi_buf_pairs(&b, "exitcode", "1");
            fpmi_buf_pair(&b, "msg", msg, strnlen(msg, PMI2_MAX_VALLEN));
            fpmi_text_write(g.text, &b);
            fpmi_buf_free(&b);
        }
    }
    if (locked)
        pthread_mutex_unlock(&mu);
    fprintf(stderr, "libfastpmi: rank %d: abort: %s\n", g.rank, msg);
    exit(1);
}

EXPORT int PMI2_Job_Spawn(int count, const char *cmds[], int argcs[], const char **argvs[], const int maxprocs[],
                          const int info_keyval_sizes[], const struct MPID_Info *info_keyval_vectors[],
                          int preput_keyval_size, const struct MPID_Info *preput_keyval_vector[], char jobId[],
                          int jobIdSize, int errors[])
{
    LOCK();
    NEED_INIT();
    if (count < 1 || cmds == NULL || maxprocs == NULL || preput_keyval_size < 0)
        RETURN(PMI2_ERR_INVALID_ARG);
    char k[32];
    fpmi_buf_start(&wb, "spawn");
    fpmi_buf_pairi(&wb, "ncmds", count);
    fpmi_buf_pairi(&wb, "preputcount", preput_keyval_size);
    for (int i = 0; i < preput_keyval_size; i++) {
        const struct MPID_Info *p = preput_keyval_vector ? preput_keyval_vector[i] : NULL;
        if (p == NULL)
            RETURN(PMI2_ERR_INVALID_ARG);
        snprintf(k, sizeof k, "ppkey%d", i);
        fpmi_buf_pairs(&wb, k, p->key);
        snprintf(k, sizeof k, "ppval%d", i);
        fpmi_buf_pairs(&wb, k, p->value);
    }
    for (int c = 0; c < count; c++) {
        if (cmds[c] == NULL)
            RETURN(PMI2_ERR_INVALID_ARG);
        fpmi_buf_pairs(&wb, "subcmd", cmds[c]);
        fpmi_buf_pairi(&wb, "maxprocs", maxprocs[c]);
        int argc = argcs ? argcs[c] : 0;
        fpmi_buf_pairi(&wb, "argc", argc);
        for (int a = 0; a < argc; a++) {
            snprintf(k, sizeof k, "argv%d", a);
            fpmi_buf_pairs(&wb, k, argvs && argvs[c] ? argvs[c][a] : "");
        }
        int ninfo = info_keyval_sizes ? info_keyval_sizes[c] : 0;
        if (ninfo > 0) {
            fpmi_buf_pairi(&wb, "infokeycount", ninfo);
            /* As Slurm's library reads them: command c's info keys are
             * an array of ninfo entries (not the entries' next list). */
            const struct MPID_Info *v = info_keyval_vectors ? info_keyval_vectors[c] : NULL;
            if (v == NULL)
                RETURN(PMI2_ERR_INVALID_ARG);
            for (int i = 0; i < ninfo; i++) {
                const struct MPID_Info *p = &v[i];
                snprintf(k, sizeof k, "infokey%d", i);
                fpmi_buf_pairs(&wb, k, p->key);
                snprintf(k, sizeof k, "infoval%d", i);
                fpmi_buf_pairs(&wb, k, p->value);
            }
        }
    }
    struct fpmi_treq *r = NULL;
    const char *j = NULL, *e = NULL;
    size_t jn = 0;
    if (g.kind == T_SHM && g.text == NULL) {
        /* Without PMI_FD (pmirun --pmi-port) the segment carries the same
         * request, framed, in one message, answered with the new job's
         * id. PMI_FD is preferred: a ring message is at most half the
         * ring (8 KiB by default), a frame 64 KiB. */
        uint16_t st;
        if (fpmi_buf_finish(&wb) != 0) {
            seterr("spawn request too long");
            RETURN(PMI2_FAIL);
        }
        int c = fpmi_shm_call(g.shm, FPMI_OP_SPAWN, 0, wb.p, wb.n, NULL, 0, &st, &j, &jn, g.err, sizeof g.err);
        if (c != 0) {
            seterr("spawn: %s", g.err);
            RETURN(shm_rc(c));
        }
    } else {
        int rc = tcall("spawn", &r);
        if (rc != PMI2_SUCCESS)
            RETURN(rc);
        j = fpmi_msg_get(&r->resp, "jobid", &jn);
        e = fpmi_msg_get(&r->resp, "errcodes", NULL);
    }
    if (jobId != NULL && jobIdSize > 0)
        copy_out(jobId, jobIdSize, j ? j : "", j ? jn : 0);
    if (errors != NULL) {
        int total = 0;
        for (int c = 0; c < count; c++)
            total += maxprocs[c];
        for (int i = 0; i < total; i++) {
            errors[i] = e && *e ? atoi(e) : 0;
            if (e && (e = strchr(e, ',')) != NULL)
                e++;
        }
    }
    fpmi_treq_free(r);
    RETURN(PMI2_SUCCESS);
}

EXPORT int PMI2_Job_GetId(char jobid[], int jobid_size)
{
    LOCK();
    NEED_INIT();
    if (jobid == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    /* Cut to fit, and a success, as Slurm's library does. */
    (void)copy_out(jobid, jobid_size, g.jobid, strlen(g.jobid));
    RETURN(PMI2_SUCCESS);
}

/* PMI2_Job_GetRank and PMI2_Info_GetSize do not wait for mu (ident). */
EXPORT int PMI2_Job_GetRank(int *rank)
{
    uint64_t id;
    int rc = ident_load(&id);
    if (rc != PMI2_SUCCESS)
        return rc;
    if (rank == NULL)
        return PMI2_ERR_INVALID_ARG;
    *rank = (int)(uint32_t)id;
    return PMI2_SUCCESS;
}

EXPORT int PMI2_Info_GetSize(int *size)
{
    uint64_t id;
    int rc = ident_load(&id);
    if (rc != PMI2_SUCCESS)
        return rc;
    if (size == NULL)
        return PMI2_ERR_INVALID_ARG;
    *size = (int)((id & ~IDENT_INIT) >> 32);
    return PMI2_SUCCESS;
}

EXPORT int PMI2_Job_Connect(const char jobid[], PMI2_Connect_comm_t *conn)
{
    LOCK();
    NEED_INIT();
    (void)conn;
    fpmi_buf_start(&wb, "job-connect");
    fpmi_buf_pairs(&wb, "jobid", jobid);
    struct fpmi_treq *r;
    int rc = tcall("job-connect", &r);
    fpmi_treq_free(r);
    RETURN(rc);
}

EXPORT int PMI2_Job_Disconnect(const char jobid[])
{
    LOCK();
    NEED_INIT();
    fpmi_buf_start(&wb, "job-disconnect");
    fpmi_buf_pairs(&wb, "jobid", jobid);
    struct fpmi_treq *r;
    int rc = tcall("job-disconnect", &r);
    fpmi_treq_free(r);
    RETURN(rc);
}

/* ---- KVS --------------------------------------------------------------- */

static struct kv **kv_find(struct kv **list, const char *key)
{
    for (; *list != NULL; list = &(*list)->next)
        if (strcmp((*list)->key, key) == 0)
            break;
    return list;
}

static int kv_set(struct kv **list, const char *key, const char *val, size_t n)
{
    struct kv **p = kv_find(list, key);
    char *v = malloc(n + 1);
    if (v == NULL)
        return PMI2_ERR_NOMEM;
    memcpy(v, val, n);
    v[n] = '\0';
    if (*p != NULL) {
        free((*p)->val);
        (*p)->val = v;
        return PMI2_SUCCESS;
    }
    struct kv *e = calloc(1, sizeof *e);
    if (e == NULL || (e->key = strdup(key)) == NULL) {
        free(e);
        free(v);
        return PMI2_ERR_NOMEM;
    }
    e->val = v;
    *p = e;
    return PMI2_SUCCESS;
}

static int check_kv(const char *key, const char *value)
{
    if (key == NULL || *key == '\0')
        return PMI2_ERR_INVALID_KEY;
    if (strlen(key) > PMI2_MAX_KEYLEN)
        return PMI2_ERR_INVALID_KEY_LENGTH;
    if (value == NULL)
        return PMI2_ERR_INVALID_VAL;
    if (strlen(value) > PMI2_MAX_VALLEN)
        return PMI2_ERR_INVALID_VAL_LENGTH;
    return PMI2_SUCCESS;
}

static int put_locked(const char *key, const char *value, int hint)
{
    int rc = check_kv(key, value);
    if (rc != PMI2_SUCCESS)
        return rc;
    if (hint < PMIX_HINT_NONE || hint > PMIX_HINT_SPARSE)
        return PMI2_ERR_INVALID_ARG;
    struct fpmi_treq *r;
    switch (g.kind) {
    case T_SHM:
        /* fastpmi's agent refuses a key of the launcher's (PMI_ prefix):
         * on the text protocol with rc≠0, on the segment, where a put has
         * no answer, as a broken protocol that ends the job. Refused here
         * as the text protocol answers it. */
        if (strncmp(key, "PMI_", 4) == 0) {
            seterr("put %s: keys beginning PMI_ are the launcher's", key);
            return PMI2_ERR_OTHER;
        }
        if (fpmi_shm_put(g.shm, key, value, strlen(value), hint, g.err, sizeof g.err) != 0) {
            seterr("put: %s", g.err);
            return PMI2_FAIL;
        }
        return PMI2_SUCCESS;
    case T_TEXT:
        /* Hydra stores "a;b" as "a" and says nothing (it does not read
         * the escape ";;"): refused, as the Go client refuses it. */
        if (g.hydra && strchr(value, ';') != NULL) {
            seterr("put %s: a ';' in the value, which this launcher's PMI-2 server takes for its end", key);
            return PMI2_ERR_INVALID_VAL;
        }
        fpmi_buf_start(&wb, "kvs-put");
        fpmi_buf_pairs(&wb, "key", key);
        fpmi_buf_pairs(&wb, "value", value);
        if (g.ext && hint != PMIX_HINT_NONE)
            fpmi_buf_pairs(&wb, "fastpmi-hint", hint == PMIX_HINT_DENSE ? "dense" : "sparse");
        rc = tcall("kvs-put", &r);
        fpmi_treq_free(r);
        return rc;
    default:
        return kv_set(&g.kvs, key, value, strlen(value));
    }
}

EXPORT int PMI2_KVS_Put(const char key[], const char value[])
{
    LOCK();
    NEED_INIT();
    RETURN(put_locked(key, value, PMIX_HINT_NONE));
}

EXPORT int PMIX_KVS_Put_hint(const char key[], const char value[], int hint)
{
    LOCK();
    NEED_INIT();
    RETURN(put_locked(key, value, hint));
}

/* serialize: a PMI-2 server other than fastpmi's (Slurm's refuses a second
 * kvs-fence from a rank before the first is answered) gets one collective
 * at a time, so outstanding requests complete before the next starts. */
static int serialize(void)
{
    if (g.kind != T_TEXT || g.ext)
        return PMI2_SUCCESS;
    if (fpmi_text_drain(g.text, g.err, sizeof g.err) != 0) {
        seterr("%s", g.err);
        return PMI2_FAIL;
    }
    return PMI2_SUCCESS;
}

/* start_fence and finish: the collectives' two halves, shared by the
 * blocking calls and the requests. */
static int start_fence(struct PMIX_Request_s *q)
{
    if (serialize() != PMI2_SUCCESS)
        return PMI2_FAIL;
    switch (g.kind) {
    case T_SHM:
        if (fpmi_shm_start_fence(g.shm, q->detached, &q->epoch, g.err, sizeof g.err) != 0) {
            seterr("fence: %s", g.err);
            return PMI2_FAIL;
        }
        return PMI2_SUCCESS;
    case T_TEXT:
        fpmi_buf_start(&wb, "kvs-fence");
        if (g.ext && q->detached)
            fpmi_buf_pairs(&wb, "fastpmi-detached", "TRUE");
        q->tr = fpmi_text_send(g.text, &wb, "kvs-fence", g.err, sizeof g.err);
        if (q->tr == NULL) {
            seterr("fence: %s", g.err);
            return PMI2_FAIL;
        }
        g.fenced = 1;
        return PMI2_SUCCESS;
    default:
        return PMI2_SUCCESS;
    }
}

static const char hexdig[] = "0123456789abcdef";

/* AG_PART is how many hex digits of an emulated allgather's value one key
 * holds (with the first part's count prefix, within PMI2_MAX_VALLEN). */
#define AG_PART 1000

/* tohex returns v[n] hex-encoded, NUL-terminated, in memory the caller
 * frees; NULL if out of memory. */
static char *tohex(const char *v, size_t n)
{
    char *hex = malloc(2 * n + 1);
    if (hex == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = hexdig[(unsigned char)v[i] >> 4];
        hex[2 * i + 1] = hexdig[(unsigned char)v[i] & 15];
    }
    hex[2 * n] = '\0';
    return hex;
}

/* ag_key names part p of rank r's value in emulated allgather agnum. */
static void ag_key(char *key, size_t cap, int agnum, int r, int p)
{
    if (p == 0)
        snprintf(key, cap, "fastpmi-ag-%d-%d", agnum, r);
    else
        snprintf(key, cap, "fastpmi-ag-%d-%d-%d", agnum, r, p);
}

static int put_parted(int agnum, const char *v, size_t n);
static int get_parted(int agnum, int r, char *buf, size_t *n, const char *what);
static int q_done(struct PMIX_Request_s *q, int wait, int *rc);
static int finish(struct PMIX_Request_s *q);
static struct tview *tview_new(void);

/* harvest completes every pending shared-memory allgather that the
 * allgather of epoch e would overwrite (result buffer e & 1 holds epoch
 * e-2's results, and older ones of that parity) and copies its results
 * out of the segment: into its buffer, or for a zero-copy view into a
 * library copy (as on the text protocol). Starting epoch e waits for e-2
 * anyway, so the wait here adds none. */
static void harvest(uint32_t e)
{
    struct PMIX_Request_s **pp = &g.pending;
    while (*pp != NULL) {
        struct PMIX_Request_s *q = *pp;
        if ((int32_t)(e - 2 - q->epoch) < 0) {
            pp = &q->next;
            continue;
        }
        *pp = q->next;
        q->next = NULL;
        q_done(q, 1, &q->rc);
        if (q->rc == PMI2_SUCCESS && q->outview != NULL && (q->view = tview_new()) == NULL)
            q->rc = PMI2_ERR_NOMEM;
        if (q->rc == PMI2_SUCCESS)
            q->rc = finish(q);
        q->done = 1;
    }
}

/* unpend takes q off g.pending, if it is there. */
static void unpend(struct PMIX_Request_s *q)
{
    for (struct PMIX_Request_s **pp = &g.pending; *pp != NULL; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            q->next = NULL;
            return;
        }
}

static int start_allgather(struct PMIX_Request_s *q, const char *v, size_t n)
{
    q->allgather = 1;
    if (serialize() != PMI2_SUCCESS)
        return PMI2_FAIL;
    switch (g.kind) {
    case T_SHM: {
        /* Epoch e reuses e-2's slot and results: harvest and the start
         * wait for e-2, which the rank may have started detached. */
        uint32_t e = fpmi_shm_next_epoch(g.shm);
        if (e > 2 && fpmi_shm_will_wait(g.shm, e - 2, g.err, sizeof g.err) != 0) {
            seterr("allgather: %s", g.err);
            return PMI2_FAIL;
        }
        harvest(e);
        if (fpmi_shm_start_allgather(g.shm, v, n, q->detached, &q->epoch, g.err, sizeof g.err) != 0) {
            seterr("allgather: %s", g.err);
            return PMI2_FAIL;
        }
        struct PMIX_Request_s **pp = &g.pending;
        while (*pp != NULL)
            pp = &(*pp)->next;
        *pp = q;
        return PMI2_SUCCESS;
    }
    case T_TEXT:
        if (g.ext) {
            /* A value holding a NUL byte, which the wire does not carry,
             * goes hex-encoded; hex=TRUE takes the values back so when any
             * holds one (the agent's serveAllgather). */
            fpmi_buf_start(&wb, "fastpmi-allgather");
            if (memchr(v, '\0', n) != NULL) {
                char *hex = tohex(v, n);
                if (hex == NULL)
                    return PMI2_ERR_NOMEM;
                fpmi_buf_pair(&wb, "value", hex, 2 * n);
                free(hex);
                fpmi_buf_pairs(&wb, "valenc", "hex");
            } else {
                fpmi_buf_pair(&wb, "value", v, n);
            }
            fpmi_buf_pairs(&wb, "hex", "TRUE");
            if (q->detached)
                fpmi_buf_pairs(&wb, "fastpmi-detached", "TRUE");
            q->tr = fpmi_text_send(g.text, &wb, "fastpmi-allgather", g.err, sizeof g.err);
        } else {
            /* Plain PMI-2: put the value (put_parted), fence; the gets
             * follow when the fence is done. */
            q->agnum = ++g.nag;
            int rc = put_parted(q->agnum, v, n);
            if (rc != PMI2_SUCCESS)
                return rc;
            fpmi_buf_start(&wb, "kvs-fence");
            q->tr = fpmi_text_send(g.text, &wb, "kvs-fence", g.err, sizeof g.err);
            g.fenced |= q->tr != NULL;
        }
        if (q->tr == NULL) {
            seterr("allgather: %s", g.err);
            return PMI2_FAIL;
        }
        return PMI2_SUCCESS;
    default:
        /* Copied, as the other transports take the value at the start:
         * the caller may change or free it before PMIX_Wait. */
        if ((q->sval = malloc(n + 1)) == NULL)
            return PMI2_ERR_NOMEM;
        memcpy(q->sval, v, n);
        q->slen = n;
        return PMI2_SUCCESS;
    }
}

/* progress: 1 if q completed (wait: blocks until it does), 0 if not yet,
 * or a PMI-2 error code (negative or positive, never 1... see below). */
static int q_done(struct PMIX_Request_s *q, int wait, int *rc)
{
    *rc = PMI2_SUCCESS;
    switch (g.kind) {
    case T_SHM: {
        int d = fpmi_shm_done(g.shm, q->epoch, wait, g.err, sizeof g.err);
        if (d < 0) { /* the agent failed it (-2): PMI2_ERR_OTHER, as a refusal */
            seterr("collective %u: %s", q->epoch, g.err);
            *rc = d == -2 ? PMI2_ERR_OTHER : PMI2_FAIL;
            return 1;
        }
        return d;
    }
    case T_TEXT:
        while (!q->tr->done) {
            if (!wait) {
                struct pollfd p = {.fd = fpmi_text_fd(g.text), .events = POLLIN};
                if (poll(&p, 1, 0) != 1)
                    return 0;
            }
            if (fpmi_text_progress(g.text, g.err, sizeof g.err) != 0) {
                seterr("%s", g.err);
                *rc = PMI2_FAIL;
                return 1;
            }
        }
        if (q->tr->rc != 0) { /* a wire code: PMI2_ERR_OTHER, as tcall */
            const char *m = fpmi_msg_get(&q->tr->resp, "errmsg", NULL);
            seterr("%s failed (rc=%d): %s", q->tr->cmd, q->tr->rc, m ? m : "");
            *rc = PMI2_ERR_OTHER;
        }
        return 1;
    default:
        return 1;
    }
}

static int unhex(const char *h, size_t hn, char *out)
{
    if (hn % 2)
        return -1;
    for (size_t i = 0; i < hn / 2; i++) {
        const char *a = strchr(hexdig, h[2 * i]), *b = strchr(hexdig, h[2 * i + 1]);
        if (a == NULL || b == NULL || h[2 * i] == '\0' || h[2 * i + 1] == '\0')
            return -1;
        out[i] = (char)(((a - hexdig) << 4) | (b - hexdig));
    }
    return 0;
}

/* deliver stores rank r's allgather value into q's buffer or view. */
static int deliver(struct PMIX_Request_s *q, int r, const char *v, size_t n)
{
    if (q->view != NULL) {
        char *c = malloc(n + 1);
        if (c == NULL)
            return PMI2_ERR_NOMEM;
        memcpy(c, v, n);
        c[n] = '\0';
        q->view->vals[r] = c;
        q->view->lens[r] = n;
        return PMI2_SUCCESS;
    }
    char *dst = (char *)q->buffer + (size_t)r * PMIX_MAX_VALLEN;
    if (n >= PMIX_MAX_VALLEN)
        n = PMIX_MAX_VALLEN - 1;
    memcpy(dst, v, n);
    memset(dst + n, 0, PMIX_MAX_VALLEN - n);
    return PMI2_SUCCESS;
}

/* finish completes an allgather's delivery once q is done. */
static int finish(struct PMIX_Request_s *q)
{
    if (!q->allgather || (q->buffer == NULL && q->view == NULL))
        return PMI2_SUCCESS;
    if (g.kind == T_SINGLETON)
        return deliver(q, 0, q->sval, q->slen);
    if (g.kind == T_SHM) {
        /* A view is read in place by PMIX_View_get (q->view is NULL)
         * unless harvest copies it out. */
        for (int r = 0; r < g.size; r++) {
            const char *v;
            size_t n;
            if (fpmi_shm_result(g.shm, r, q->epoch, &v, &n) != 0) {
                seterr("allgather %u: no value of rank %d", q->epoch, r);
                return PMI2_FAIL;
            }
            int rc = deliver(q, r, v, n);
            if (rc != PMI2_SUCCESS)
                return rc;
        }
        return PMI2_SUCCESS;
    }
    if (g.ext) {
        const char *enc = fpmi_msg_get(&q->tr->resp, "enc", NULL);
        int hexed = enc != NULL && strcmp(enc, "hex") == 0;
        for (int r = 0; r < g.size; r++) {
            char k[32], buf[PMI2_MAX_VALLEN + 1];
            size_t n = 0;
            snprintf(k, sizeof k, "v%d", r);
            const char *v = fpmi_msg_get(&q->tr->resp, k, &n);
            if (v != NULL && hexed) {
                if (n / 2 > PMI2_MAX_VALLEN || unhex(v, n, buf) != 0) {
                    seterr("allgather value of rank %d malformed", r);
                    return PMI2_FAIL;
                }
                v = buf;
                n /= 2;
            }
            int rc = deliver(q, r, v ? v : "", v ? n : 0);
            if (rc != PMI2_SUCCESS)
                return rc;
        }
        return PMI2_SUCCESS;
    }
    for (int r = 0; r < g.size; r++) {
        char buf[PMI2_MAX_VALLEN + 1];
        size_t n;
        int rc = get_parted(q->agnum, r, buf, &n, "allgather");
        if (rc == PMI2_SUCCESS)
            rc = deliver(q, r, buf, n);
        if (rc != PMI2_SUCCESS)
            return rc;
    }
    return PMI2_SUCCESS;
}

/* put_parted puts v[n] as rank g.rank's value of emulated collective
 * agnum (an allgather, or a ring under Hydra) for a launcher without
 * fastpmi's extensions: hex-encoded (the wire carries no NUL byte, Hydra
 * ends a value at its first ';'), cut into parts a server's value limit
 * takes (AG_PART hex digits a key), the first saying how many. */
static int put_parted(int agnum, const char *v, size_t n)
{
    char *hex = tohex(v, n);
    if (hex == NULL)
        return PMI2_ERR_NOMEM;
    int parts = n == 0 ? 1 : (int)((2 * n + AG_PART - 1) / AG_PART), rc = PMI2_SUCCESS;
    for (int p = 0; p < parts && rc == PMI2_SUCCESS; p++) {
        char key[64], val[PMI2_MAX_VALLEN + 1];
        size_t off = (size_t)p * AG_PART, len = 2 * n - off < AG_PART ? 2 * n - off : AG_PART;
        int m = p == 0 ? snprintf(val, sizeof val, "%d.", parts) : 0;
        memcpy(val + m, hex + off, len);
        val[m + len] = '\0';
        ag_key(key, sizeof key, agnum, g.rank, p);
        rc = put_locked(key, val, PMIX_HINT_NONE);
    }
    free(hex);
    return rc;
}

/* get_parted reads rank r's value of emulated collective agnum (put by
 * put_parted, after a fence) into buf, at most PMI2_MAX_VALLEN bytes, and
 * its length into *n; what names the collective in an error. */
static int get_parted(int agnum, int r, char *buf, size_t *n, const char *what)
{
    /* The parts' hex, gathered. */
    char hex[2 * PMI2_MAX_VALLEN + 1];
    size_t hn = 0;
    int parts = 1;
    for (int p = 0; p < parts; p++) {
        char key[64];
        struct fpmi_treq *t;
        ag_key(key, sizeof key, agnum, r, p);
        fpmi_buf_start(&wb, "kvs-get");
        fpmi_buf_pairs(&wb, "jobid", "");
        fpmi_buf_pairi(&wb, "srcid", r);
        fpmi_buf_pairs(&wb, "key", key);
        int rc = tcall("kvs-get", &t);
        if (rc != PMI2_SUCCESS)
            return rc;
        size_t vn = 0;
        const char *v = fpmi_msg_get(&t->resp, "value", &vn);
        const char *f = fpmi_msg_get(&t->resp, "found", NULL);
        int ok = v != NULL && (f == NULL || strcmp(f, "TRUE") == 0);
        if (ok && p == 0) { /* "<parts>.<hex>" */
            char *dot = memchr(v, '.', vn);
            parts = dot == NULL ? 0 : atoi(v);
            ok = parts >= 1 && parts <= (2 * PMI2_MAX_VALLEN + AG_PART - 1) / AG_PART;
            if (ok) {
                vn -= (size_t)(dot + 1 - v);
                v = dot + 1;
            }
        }
        ok = ok && hn + vn < sizeof hex;
        if (ok) {
            memcpy(hex + hn, v, vn);
            hn += vn;
        }
        fpmi_treq_free(t);
        if (!ok) {
            seterr("%s value of rank %d missing or malformed (part %d)", what, r, p);
            return PMI2_FAIL;
        }
    }
    if (hn / 2 > PMI2_MAX_VALLEN || unhex(hex, hn, buf) != 0) {
        seterr("%s value of rank %d malformed", what, r);
        return PMI2_FAIL;
    }
    *n = hn / 2;
    return PMI2_SUCCESS;
}

static void q_free(struct PMIX_Request_s *q)
{
    if (q->tr != NULL)
        fpmi_treq_free(q->tr);
    free(q->sval);
    free(q);
}

static void view_done(struct PMIX_Request_s *q, int rc);

/* tell_waiting tells fastpmi's agent that the rank now waits for q, a
 * collective it started detached (PMIX_Iallgather, PMIX_KVS_Ifence): until
 * then the agent's deadlock check does not count the rank as stuck, since
 * it may still put what another rank waits for. Other launchers have no
 * such check to tell. */
static int tell_waiting(struct PMIX_Request_s *q)
{
    switch (g.kind) {
    case T_SHM:
        if (fpmi_shm_will_wait(g.shm, q->epoch, g.err, sizeof g.err) != 0) {
            seterr("wait: %s", g.err);
            return PMI2_FAIL;
        }
        return PMI2_SUCCESS;
    case T_TEXT:
        if (!g.ext)
            return PMI2_SUCCESS;
        fpmi_buf_start(&wb, "fastpmi-block");
        fpmi_buf_pairs(&wb, "waiting", "TRUE");
        if (fpmi_text_notify(g.text, &wb) != 0) {
            seterr("wait: send fastpmi-block failed");
            return PMI2_FAIL;
        }
        return PMI2_SUCCESS;
    default:
        return PMI2_SUCCESS;
    }
}

/* wait_locked completes q (unless harvest did) and frees it. */
static int wait_locked(struct PMIX_Request_s *q)
{
    int rc = q->rc;
    if (!q->done) {
        unpend(q);
        if (!q_done(q, 0, &rc)) {
            rc = q->detached ? tell_waiting(q) : PMI2_SUCCESS;
            if (rc == PMI2_SUCCESS)
                q_done(q, 1, &rc);
        }
        if (rc == PMI2_SUCCESS)
            rc = finish(q);
    }
    if (q->outview != NULL)
        view_done(q, rc);
    q_free(q);
    return rc;
}

EXPORT int PMI2_KVS_Fence(void)
{
    LOCK();
    NEED_INIT();
    struct PMIX_Request_s *q = calloc(1, sizeof *q);
    if (q == NULL)
        RETURN(PMI2_ERR_NOMEM);
    int rc = start_fence(q);
    if (rc != PMI2_SUCCESS) {
        free(q);
        RETURN(rc);
    }
    RETURN(wait_locked(q));
}

/* A waiting get polls a launcher that cannot park it: the first retry
 * after POLL_FIRST_US, each next one twice as late, at most POLL_MAX_US
 * apart, so that ranks waiting long cost the launcher a few requests a
 * second each rather than a thousand (the Go client's pollFirst and
 * pollMax). */
#define POLL_FIRST_US 1000
#define POLL_MAX_US 32000

static int get_locked(int src, const char *key, char *value, int maxvalue, int *vallen, int wait)
{
    if (key == NULL || *key == '\0')
        return PMI2_ERR_INVALID_KEY;
    if (strlen(key) > PMI2_MAX_KEYLEN)
        return PMI2_ERR_INVALID_KEY_LENGTH;
    if (value == NULL || maxvalue <= 0)
        return PMI2_ERR_INVALID_VAL;
    const char *v = NULL;
    size_t n = 0;
    struct fpmi_treq *r = NULL;
    int rc = PMI2_SUCCESS;
    switch (g.kind) {
    case T_SHM: {
        /* Fenced keys are read in place from the node KVS: no system
         * call; anything else is asked of the agent. */
        if (fpmi_shm_lookup(g.shm, key, strlen(key), &v, &n) == 1)
            break;
        /* The segment takes a source rank in [-1, size), -1 unknown; the
         * agent ends the job for any other. The text protocol takes any
         * and treats one out of range as unknown: so does this. */
        unsigned char s[4];
        uint32_t u = (uint32_t)(src < -1 || src >= g.size ? -1 : src);
        uint16_t st;
        memcpy(s, &u, 4);
        int c = fpmi_shm_call(g.shm, FPMI_OP_GET, wait ? FPMI_GET_WAIT : 0, s, 4, key, strlen(key), &st, &v, &n,
                              g.err, sizeof g.err);
        if (c != 0) {
            seterr("get %s: %s", key, g.err);
            return shm_rc(c);
        }
        if (st == FPMI_STATUS_NOT_FOUND) { /* PMI2_ERR_OTHER, as Slurm's library */
            seterr("get %s: not found", key);
            return PMI2_ERR_OTHER;
        }
        break;
    }
    case T_TEXT:
        if (g.hydra && !g.fenced) {
            seterr("get %s: Hydra's PMI-2 server ends the whole job on a get before the rank's first fence; fence first",
                   key);
            return PMI2_ERR_OTHER;
        }
        for (useconds_t pause = POLL_FIRST_US;; pause = pause * 2 < POLL_MAX_US ? pause * 2 : POLL_MAX_US) {
            fpmi_buf_start(&wb, "kvs-get");
            fpmi_buf_pairs(&wb, "jobid", "");
            fpmi_buf_pairi(&wb, "srcid", src);
            fpmi_buf_pairs(&wb, "key", key);
            if (wait && g.ext)
                fpmi_buf_pairs(&wb, "fastpmi-wait", "TRUE");
            rc = tcall("kvs-get", &r);
            if (rc != PMI2_SUCCESS)
                return rc;
            const char *f = fpmi_msg_get(&r->resp, "found", NULL);
            if (f != NULL && strcmp(f, "TRUE") == 0) {
                v = fpmi_msg_get(&r->resp, "value", &n);
                break;
            }
            fpmi_treq_free(r);
            r = NULL;
            if (!wait || g.ext) {
                seterr("get %s: not found", key);
                return PMI2_ERR_OTHER;
            }
            usleep(pause); /* a foreign launcher cannot park the get: poll */
        }
        break;
    default: {
        struct kv **p = kv_find(&g.kvs, key);
        if (*p == NULL)
            return PMI2_ERR_OTHER;
        v = (*p)->val;
        n = strlen(v);
    }
    }
    if (v == NULL)
        v = "";
    int trunc = copy_out(value, maxvalue, v, n);
    if (vallen != NULL)
        *vallen = trunc ? -(int)n : (int)n;
    fpmi_treq_free(r);
    return PMI2_SUCCESS;
}

EXPORT int PMI2_KVS_Get(const char *jobid, int src_pmi_id, const char key[], char value[], int maxvalue, int *vallen)
{
    LOCK();
    NEED_INIT();
    (void)jobid;
    RETURN(get_locked(src_pmi_id, key, value, maxvalue, vallen, 0));
}

EXPORT int PMIX_KVS_Get_wait(const char *jobid, int src_pmi_id, const char key[], char value[], int maxvalue,
                             int *vallen)
{
    LOCK();
    NEED_INIT();
    (void)jobid;
    RETURN(get_locked(src_pmi_id, key, value, maxvalue, vallen, 1));
}

/* ---- attributes -------------------------------------------------------- */

/* NAME_MAX_LEN bounds attribute and service names and ports, on every
 * transport: refused here, a name never makes a frame that the server's
 * limit (64 KiB) refuses by ending the job. */
#define NAME_MAX_LEN PMI2_MAX_VALLEN

static int node_attr_locked(const char *name, char *value, int valuelen, int *found, int waitfor)
{
    if (name == NULL || *name == '\0' || value == NULL || found == NULL)
        return PMI2_ERR_INVALID_ARG;
    if (strnlen(name, NAME_MAX_LEN + 1) > NAME_MAX_LEN)
        return PMI2_ERR_INVALID_KEY_LENGTH;
    *found = 0;
    if (g.kind == T_SHM) {
        uint16_t st;
        const char *v;
        size_t n;
        int c = fpmi_shm_call(g.shm, FPMI_OP_GET_NODE_ATTR, waitfor ? FPMI_GET_WAIT : 0, name, strlen(name), NULL, 0,
                              &st, &v, &n, g.err, sizeof g.err);
        if (c != 0) {
            seterr("node attribute %s: %s", name, g.err);
            return shm_rc(c);
        }
        if (st == FPMI_STATUS_OK) {
            *found = 1;
            copy_out(value, valuelen, v, n);
        }
        return PMI2_SUCCESS;
    }
    if (g.kind == T_SINGLETON) {
        struct kv **p = kv_find(&g.nodeattrs, name);
        if (*p != NULL) {
            *found = 1;
            copy_out(value, valuelen, (*p)->val, strlen((*p)->val));
        }
        return PMI2_SUCCESS;
    }
    fpmi_buf_start(&wb, "info-getnodeattr");
    fpmi_buf_pairs(&wb, "key", name);
    fpmi_buf_pairs(&wb, "wait", waitfor ? "TRUE" : "FALSE");
    return tcall_found("info-getnodeattr", value, valuelen, found);
}

EXPORT int PMI2_Info_GetNodeAttr(const char name[], char value[], int valuelen, int *found, int waitfor)
{
    LOCK();
    NEED_INIT();
    RETURN(node_attr_locked(name, value, valuelen, found, waitfor));
}

EXPORT int PMI2_Info_PutNodeAttr(const char name[], const char value[])
{
    LOCK();
    NEED_INIT();
    int rc = check_kv(name, value);
    if (rc != PMI2_SUCCESS)
        RETURN(rc);
    if (g.kind == T_SINGLETON)
        RETURN(kv_set(&g.nodeattrs, name, value, strlen(value)));
    if (g.kind == T_SHM) {
        size_t nl = strlen(name);
        unsigned char h[2] = {(unsigned char)(nl & 0xff), (unsigned char)(nl >> 8)};
        char pair[PMI2_MAX_KEYLEN + PMI2_MAX_VALLEN + 2];
        size_t vl = strlen(value);
        uint16_t st;
        const char *v;
        size_t n;
        memcpy(pair, name, nl);
        memcpy(pair + nl, value, vl);
        int c = fpmi_shm_call(g.shm, FPMI_OP_PUT_NODE_ATTR, 0, h, 2, pair, nl + vl, &st, &v, &n, g.err, sizeof g.err);
        if (c != 0) {
            seterr("node attribute %s: %s", name, g.err);
            RETURN(shm_rc(c));
        }
        RETURN(PMI2_SUCCESS);
    }
    fpmi_buf_start(&wb, "info-putnodeattr");
    fpmi_buf_pairs(&wb, "key", name);
    fpmi_buf_pairs(&wb, "value", value);
    struct fpmi_treq *r;
    rc = tcall("info-putnodeattr", &r);
    fpmi_treq_free(r);
    RETURN(rc);
}

static int job_attr_locked(const char *name, char *value, int valuelen, int *found)
{
    if (name == NULL || *name == '\0' || value == NULL || found == NULL)
        return PMI2_ERR_INVALID_ARG;
    if (strnlen(name, NAME_MAX_LEN + 1) > NAME_MAX_LEN)
        return PMI2_ERR_INVALID_KEY_LENGTH;
    *found = 0;
    if (g.kind == T_SHM) {
        uint16_t st;
        const char *v;
        size_t n;
        int c = fpmi_shm_call(g.shm, FPMI_OP_JOB_ATTR, 0, name, strlen(name), NULL, 0, &st, &v, &n, g.err,
                              sizeof g.err);
        if (c != 0) {
            seterr("job attribute %s: %s", name, g.err);
            return shm_rc(c);
        }
        if (st == FPMI_STATUS_OK) {
            *found = 1;
            copy_out(value, valuelen, v, n);
        }
        return PMI2_SUCCESS;
    }
    if (g.kind == T_SINGLETON) {
        if (strcmp(name, "PMI_process_mapping") == 0) {
            *found = 1;
            copy_out(value, valuelen, "(vector,(0,1,1))", 16);
        }
        return PMI2_SUCCESS;
    }
    fpmi_buf_start(&wb, "info-getjobattr");
    fpmi_buf_pairs(&wb, "key", name);
    return tcall_found("info-getjobattr", value, valuelen, found);
}

EXPORT int PMI2_Info_GetJobAttr(const char name[], char value[], int valuelen, int *found)
{
    LOCK();
    NEED_INIT();
    RETURN(job_attr_locked(name, value, valuelen, found));
}

/* int_array parses attribute name's value s, "a,b,c", into array (at
 * most arraylen entries). A value that is no such list (empty, a word, a
 * trailing comma) is PMI2_ERR_OTHER, as Slurm's library returns. */
static int int_array(const char *name, const char *s, int array[], int arraylen, int *outlen)
{
    const char *v0 = s;
    int n = 0;
    while (n < arraylen) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || (*end != ',' && *end != '\0')) {
            seterr("attribute %s: \"%s\" is not a list of integers", name, v0);
            return PMI2_ERR_OTHER;
        }
        array[n++] = (int)v;
        if (*end == '\0')
            break;
        s = end + 1;
    }
    *outlen = n;
    return PMI2_SUCCESS;
}

EXPORT int PMI2_Info_GetJobAttrIntArray(const char name[], int array[], int arraylen, int *outlen, int *found)
{
    char v[PMI2_MAX_ATTRVALUE + 1];
    LOCK();
    NEED_INIT();
    if (array == NULL || outlen == NULL || found == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    int rc = job_attr_locked(name, v, sizeof v, found);
    if (rc != PMI2_SUCCESS || !*found)
        RETURN(rc);
    RETURN(int_array(name, v, array, arraylen, outlen));
}

EXPORT int PMI2_Info_GetNodeAttrIntArray(const char name[], int array[], int arraylen, int *outlen, int *found)
{
    char v[PMI2_MAX_ATTRVALUE + 1];
    LOCK();
    NEED_INIT();
    if (array == NULL || outlen == NULL || found == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    int rc = node_attr_locked(name, v, sizeof v, found, 0);
    if (rc != PMI2_SUCCESS || !*found)
        RETURN(rc);
    RETURN(int_array(name, v, array, arraylen, outlen));
}

/* ---- names ------------------------------------------------------------- */

static int names_shm(uint16_t op, const char *name, const char *port, char *out, int outlen)
{
    uint16_t st;
    const char *v;
    size_t n, nl = strlen(name);
    int rc;
    if (op == FPMI_OP_PUBLISH) {
        unsigned char h[2] = {(unsigned char)(nl & 0xff), (unsigned char)(nl >> 8)};
        char *p = malloc(nl + strlen(port) + 1);
        if (p == NULL)
            return PMI2_ERR_NOMEM;
        memcpy(p, name, nl);
        memcpy(p + nl, port, strlen(port));
        rc = fpmi_shm_call(g.shm, op, 0, h, 2, p, nl + strlen(port), &st, &v, &n, g.err, sizeof g.err);
        free(p);
    } else {
        rc = fpmi_shm_call(g.shm, op, 0, name, nl, NULL, 0, &st, &v, &n, g.err, sizeof g.err);
    }
    if (rc != 0) {
        seterr("%s: %s", name, g.err);
        return shm_rc(rc);
    }
    if (st != FPMI_STATUS_OK) { /* refused by the agent: as tcall */
        seterr("%s: not published", name);
        return PMI2_ERR_OTHER;
    }
    if (out != NULL)
        (void)copy_out(out, outlen, v, n); /* cut to fit, as the text path */
    return PMI2_SUCCESS;
}

EXPORT int PMI2_Nameserv_publish(const char service_name[], const struct MPID_Info *info_ptr, const char port[])
{
    LOCK();
    NEED_INIT();
    (void)info_ptr;
    if (service_name == NULL || *service_name == '\0' || port == NULL || *port == '\0')
        RETURN(PMI2_ERR_INVALID_ARG);
    if (strnlen(service_name, NAME_MAX_LEN + 1) > NAME_MAX_LEN || strnlen(port, NAME_MAX_LEN + 1) > NAME_MAX_LEN)
        RETURN(PMI2_ERR_INVALID_LENGTH);
    if (g.kind == T_SHM)
        RETURN(names_shm(FPMI_OP_PUBLISH, service_name, port, NULL, 0));
    if (g.kind == T_SINGLETON) { /* a name service of its own, as the Go client's; refusals as a launcher's */
        if (*kv_find(&g.names, service_name) != NULL) {
            seterr("%s: published already", service_name);
            RETURN(PMI2_ERR_OTHER);
        }
        RETURN(kv_set(&g.names, service_name, port, strlen(port)));
    }
    fpmi_buf_start(&wb, "name-publish");
    fpmi_buf_pairs(&wb, "name", service_name);
    fpmi_buf_pairs(&wb, "port", port);
    struct fpmi_treq *r;
    int rc = tcall("name-publish", &r);
    fpmi_treq_free(r);
    RETURN(rc);
}

EXPORT int PMI2_Nameserv_lookup(const char service_name[], const struct MPID_Info *info_ptr, char port[], int portLen)
{
    LOCK();
    NEED_INIT();
    (void)info_ptr;
    if (service_name == NULL || *service_name == '\0' || port == NULL || portLen <= 0)
        RETURN(PMI2_ERR_INVALID_ARG);
    if (strnlen(service_name, NAME_MAX_LEN + 1) > NAME_MAX_LEN)
        RETURN(PMI2_ERR_INVALID_LENGTH);
    if (g.kind == T_SHM)
        RETURN(names_shm(FPMI_OP_LOOKUP, service_name, NULL, port, portLen));
    if (g.kind == T_SINGLETON) {
        struct kv *e = *kv_find(&g.names, service_name);
        if (e == NULL) {
            seterr("%s: not published", service_name);
            RETURN(PMI2_ERR_OTHER);
        }
        (void)copy_out(port, portLen, e->val, strlen(e->val)); /* cut to fit, as the text path */
        RETURN(PMI2_SUCCESS);
    }
    fpmi_buf_start(&wb, "name-lookup");
    fpmi_buf_pairs(&wb, "name", service_name);
    struct fpmi_treq *r;
    int rc = tcall("name-lookup", &r);
    if (rc != PMI2_SUCCESS)
        RETURN(rc);
    size_t n = 0;
    const char *v = fpmi_msg_get(&r->resp, "port", &n);
    if (v == NULL)
        v = fpmi_msg_get(&r->resp, "value", &n);
    if (v == NULL) { /* not found, as Slurm's library says it */
        fpmi_treq_free(r);
        seterr("%s: name-lookup-response without a port", service_name);
        RETURN(PMI2_ERR_OTHER);
    }
    (void)copy_out(port, portLen, v, n); /* cut to fit, and a success, as Slurm's library does */
    fpmi_treq_free(r);
    RETURN(PMI2_SUCCESS);
}

EXPORT int PMI2_Nameserv_unpublish(const char service_name[], const struct MPID_Info *info_ptr)
{
    LOCK();
    NEED_INIT();
    (void)info_ptr;
    if (service_name == NULL || *service_name == '\0')
        RETURN(PMI2_ERR_INVALID_ARG);
    if (strnlen(service_name, NAME_MAX_LEN + 1) > NAME_MAX_LEN)
        RETURN(PMI2_ERR_INVALID_LENGTH);
    if (g.kind == T_SHM)
        RETURN(names_shm(FPMI_OP_UNPUBLISH, service_name, NULL, NULL, 0));
    if (g.kind == T_SINGLETON) {
        struct kv **p = kv_find(&g.names, service_name), *e = *p;
        if (e == NULL) {
            seterr("%s: not published", service_name);
            RETURN(PMI2_ERR_OTHER);
        }
        *p = e->next;
        free(e->key);
        free(e->val);
        free(e);
        RETURN(PMI2_SUCCESS);
    }
    fpmi_buf_start(&wb, "name-unpublish");
    fpmi_buf_pairs(&wb, "name", service_name);
    struct fpmi_treq *r;
    int rc = tcall("name-unpublish", &r);
    fpmi_treq_free(r);
    RETURN(rc);
}

/* ---- ring -------------------------------------------------------------- */

EXPORT int PMIX_Ring(const char value[], int *rank, int *ranks, char left[], char right[], int maxvalue)
{
    LOCK();
    NEED_INIT();
    if (value == NULL || rank == NULL || ranks == NULL || left == NULL || right == NULL || maxvalue <= 0)
        RETURN(PMI2_ERR_INVALID_ARG);
    size_t vn = strlen(value);
    if (vn > PMI2_MAX_VALLEN)
        RETURN(PMI2_ERR_INVALID_VAL_LENGTH);
    if (g.kind == T_SINGLETON) {
        *rank = 0;
        *ranks = 1;
        copy_out(left, maxvalue, value, vn);
        copy_out(right, maxvalue, value, vn);
        RETURN(PMI2_SUCCESS);
    }
    if (g.kind == T_SHM) {
        uint16_t st;
        const char *p;
        size_t n;
        int c = fpmi_shm_call(g.shm, FPMI_OP_RING, 0, value, vn, NULL, 0, &st, &p, &n, g.err, sizeof g.err);
        if (c != 0) {
            seterr("ring: %s", g.err);
            RETURN(shm_rc(c));
        }
        uint32_t pos, size, ln;
        if (n < 12)
            RETURN(PMI2_FAIL);
        memcpy(&pos, p, 4);
        memcpy(&size, p + 4, 4);
        memcpy(&ln, p + 8, 4);
        if (ln > n - 12)
            RETURN(PMI2_FAIL);
        *rank = (int)pos;
        *ranks = (int)size;
        /* Cut to fit, and a success, as Slurm's library and the singleton. */
        (void)copy_out(left, maxvalue, p + 12, ln);
        (void)copy_out(right, maxvalue, p + 12 + ln, n - 12 - ln);
        RETURN(PMI2_SUCCESS);
    }
    if (g.hydra) {
        /* Hydra's PMI-2 has no ring command, on which it ends the whole
         * job: a put, a fence and the two neighbours' gets, as the Go
         * client does. The position is the rank. */
        int agnum = ++g.nag, rc = put_parted(agnum, value, vn);
        struct fpmi_treq *f = NULL;
        if (rc == PMI2_SUCCESS) {
            fpmi_buf_start(&wb, "kvs-fence");
            rc = tcall("kvs-fence", &f);
            g.fenced |= rc == PMI2_SUCCESS;
            fpmi_treq_free(f);
        }
        char buf[PMI2_MAX_VALLEN + 1];
        size_t n;
        if (rc == PMI2_SUCCESS && (rc = get_parted(agnum, (g.rank + g.size - 1) % g.size, buf, &n, "ring")) == PMI2_SUCCESS)
            (void)copy_out(left, maxvalue, buf, n); /* cut to fit, as above */
        if (rc == PMI2_SUCCESS && (rc = get_parted(agnum, (g.rank + 1) % g.size, buf, &n, "ring")) == PMI2_SUCCESS)
            (void)copy_out(right, maxvalue, buf, n);
        if (rc != PMI2_SUCCESS)
            RETURN(rc);
        *rank = g.rank;
        *ranks = g.size;
        RETURN(PMI2_SUCCESS);
    }
    fpmi_buf_start(&wb, "ring");
    fpmi_buf_pairs(&wb, "ring-count", "1");
    fpmi_buf_pairs(&wb, "ring-left", value);
    fpmi_buf_pairs(&wb, "ring-right", value);
    struct fpmi_treq *r;
    int rc = tcall("ring", &r);
    if (rc != PMI2_SUCCESS)
        RETURN(rc);
    const char *c = fpmi_msg_get(&r->resp, "ring-count", NULL);
    size_t ln = 0, rn = 0;
    const char *l = fpmi_msg_get(&r->resp, "ring-left", &ln), *rt = fpmi_msg_get(&r->resp, "ring-right", &rn);
    if (c == NULL || l == NULL || rt == NULL) {
        fpmi_treq_free(r);
        RETURN(PMI2_FAIL);
    }
    *rank = atoi(c);
    *ranks = g.size;
    (void)copy_out(left, maxvalue, l, ln); /* cut to fit, as above */
    (void)copy_out(right, maxvalue, rt, rn);
    fpmi_treq_free(r);
    RETURN(PMI2_SUCCESS);
}

/* ---- extensions -------------------------------------------------------- */

EXPORT const char *PMIX_Transport(void)
{
    static const char *const names[] = {NULL, "shm", "pmi2", "singleton"};
    if (__atomic_load_n(&aborted, __ATOMIC_ACQUIRE))
        return NULL;
    pthread_mutex_lock(&mu);
    const char *n = g.init ? names[g.kind] : NULL;
    pthread_mutex_unlock(&mu);
    return n;
}

static int iallgather_locked(const char *value, size_t n, void *buffer, struct tview *view, int detached,
                             PMIX_Request *request)
{
    struct PMIX_Request_s *q = calloc(1, sizeof *q);
    if (q == NULL)
        return PMI2_ERR_NOMEM;
    q->buffer = buffer;
    q->view = view;
    q->detached = detached;
    int rc = start_allgather(q, value, n);
    if (rc != PMI2_SUCCESS) {
        free(q);
        return rc;
    }
    *request = q;
    return PMI2_SUCCESS;
}

/* hand_out registers the request that a start returning rc left in
 * *request (if rc is PMI2_SUCCESS) and replaces it with its handle. */
static int hand_out(int rc, PMIX_Request *request)
{
    if (rc != PMI2_SUCCESS)
        return rc;
    struct PMIX_Request_s *q = *request;
    q->handle = ++g.handles;
    q->live_next = g.live;
    g.live = q;
    *request = (PMIX_Request)q->handle;
    return PMI2_SUCCESS;
}

/* find_request returns the outstanding request of handle h, taken off
 * g.live if take; NULL (and the reason in g.err) if none has it: never
 * handed out, or waited for already. */
static struct PMIX_Request_s *find_request(PMIX_Request h, int take)
{
    for (struct PMIX_Request_s **pp = &g.live; *pp != NULL; pp = &(*pp)->live_next) {
        struct PMIX_Request_s *q = *pp;
        if (q->handle != (uintptr_t)h)
            continue;
        if (take) {
            *pp = q->live_next;
            q->live_next = NULL;
        }
        return q;
    }
    seterr("request %p is not outstanding (waited for already, or never started)", (void *)h);
    return NULL;
}

/* iallgather_checked checks PMIX_Iallgather's arguments and starts it. */
static int iallgather_checked(const char value[], void *buffer, int detached, PMIX_Request *request)
{
    if (value == NULL || buffer == NULL || request == NULL)
        return PMI2_ERR_INVALID_ARG;
    size_t n = strlen(value);
    if (n >= PMIX_MAX_VALLEN)
        return PMI2_ERR_INVALID_VAL_LENGTH;
    return iallgather_locked(value, n, buffer, NULL, detached, request);
}

EXPORT int PMIX_Iallgather(const char value[], void *buffer, PMIX_Request *request)
{
    LOCK();
    NEED_INIT();
    RETURN(hand_out(iallgather_checked(value, buffer, 1, request), request));
}

EXPORT int PMIX_Allgather(const char value[], void *buffer)
{
    LOCK();
    NEED_INIT();
    struct PMIX_Request_s *q;
    int rc = iallgather_checked(value, buffer, 0, &q);
    if (rc != PMI2_SUCCESS)
        RETURN(rc);
    RETURN(wait_locked(q));
}

EXPORT int PMIX_KVS_Ifence(PMIX_Request *request)
{
    LOCK();
    NEED_INIT();
    if (request == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    struct PMIX_Request_s *q = calloc(1, sizeof *q);
    if (q == NULL)
        RETURN(PMI2_ERR_NOMEM);
    q->detached = 1;
    int rc = start_fence(q);
    if (rc != PMI2_SUCCESS) {
        free(q);
        RETURN(rc);
    }
    *request = q;
    RETURN(hand_out(PMI2_SUCCESS, request));
}

EXPORT int PMIX_Wait(PMIX_Request request)
{
    LOCK();
    NEED_INIT();
    struct PMIX_Request_s *q = find_request(request, 1);
    if (q == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    RETURN(wait_locked(q));
}

EXPORT int PMIX_Test(PMIX_Request request, int *done)
{
    LOCK();
    NEED_INIT();
    if (done == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    struct PMIX_Request_s *q = find_request(request, 0);
    if (q == NULL)
        RETURN(PMI2_ERR_INVALID_ARG);
    int rc;
    *done = q->done || q_done(q, 0, &rc);
    RETURN(PMI2_SUCCESS);
}

/* tview_new allocates an empty copy of g.size values. */
static struct tview *tview_new(void)
{
    struct tview *tv = calloc(1, sizeof *tv);
    if (tv == NULL || (tv->vals = calloc((size_t)g.size, sizeof *tv->vals)) == NULL ||
        (tv->lens = calloc((size_t)g.size, sizeof *tv->lens)) == NULL) {
        if (tv != NULL)
            free(tv->vals);
        free(tv);
        return NULL;
    }
    tv->n = g.size;
    return tv;
}

static void tview_free(struct tview *v)
{
    if (v == NULL)
        return;
    for (int i = 0; i < v->n; i++)
        free(v->vals[i]);
    free(v->vals);
    free(v->lens);
    free(v);
}

/* iallgather_view_locked starts a zero-copy allgather whose view the
 * request's completion fills in (view_done). */
static int iallgather_view_locked(const void *value, int len, PMIX_View *view, int detached,
                                  struct PMIX_Request_s **request)
{
    if ((value == NULL && len > 0) || len < 0 || view == NULL || request == NULL)
        return PMI2_ERR_INVALID_ARG;
    if (len > PMI2_MAX_VALLEN || (g.kind == T_SHM && len > fpmi_shm_max_value(g.shm)))
        return PMI2_ERR_INVALID_VAL_LENGTH;
    struct tview *tv = NULL;
    if (g.kind != T_SHM && (tv = tview_new()) == NULL)
        return PMI2_ERR_NOMEM;
    struct PMIX_Request_s *q;
    int rc = iallgather_locked(value ? value : "", (size_t)len, NULL, tv, detached, &q);
    if (rc != PMI2_SUCCESS) {
        tview_free(tv);
        return rc;
    }
    q->outview = view;
    *request = q;
    return PMI2_SUCCESS;
}

/* view_done fills a completed zero-copy allgather's view, or (rc not
 * PMI2_SUCCESS) drops the library's copy it would have read. */
static void view_done(struct PMIX_Request_s *q, int rc)
{
    struct tview *tv = q->view;
    if (rc != PMI2_SUCCESS) {
        tview_free(tv);
        return;
    }
    q->outview->epoch = q->epoch;
    if (tv != NULL) {
        /* Keep the last two copies, as the segment keeps two epochs. A
         * copy's view has the copy's number (from 1) for its epoch, by
         * which PMIX_View_get tells one freed since. */
        unsigned n = g.nviews;
        tview_free(g.views[n % 2]);
        g.views[n % 2] = tv;
        __atomic_store_n(&g.nviews, n + 1, __ATOMIC_RELEASE);
        q->outview->epoch = n + 1;
    }
    q->outview->priv = tv;
    q->outview->size = g.size;
}

EXPORT int PMIX_Iallgather_view(const void *value, int len, PMIX_View *view, PMIX_Request *request)
{
    LOCK();
    NEED_INIT();
    RETURN(hand_out(iallgather_view_locked(value, len, view, 1, request), request));
}

EXPORT int PMIX_Allgather_view(const void *value, int len, PMIX_View *view)
{
    LOCK();
    NEED_INIT();
    struct PMIX_Request_s *q;
    int rc = iallgather_view_locked(value, len, view, 0, &q);
    if (rc != PMI2_SUCCESS)
        RETURN(rc);
    RETURN(wait_locked(q));
}

EXPORT int PMIX_View_get(const PMIX_View *view, int rank, const char **value, int *len)
{
    if (view == NULL || value == NULL || len == NULL || rank < 0 || rank >= view->size)
        return PMI2_ERR_INVALID_ARG;
    if (view->priv != NULL) {
        /* A copy: readable while it is one of the last two made (view_done);
         * an older one is freed, and the view stale, as in place. */
        if (__atomic_load_n(&g.nviews, __ATOMIC_ACQUIRE) - view->epoch >= 2)
            return PMI2_FAIL;
        const struct tview *tv = view->priv;
        *value = tv->vals[rank] ? tv->vals[rank] : "";
        *len = (int)tv->lens[rank];
        return PMI2_SUCCESS;
    }
    /* In place, without the lock: the segment's result entries for a
     * published epoch do not change until this rank starts epoch+2. */
    size_t n;
    if (g.shm == NULL || fpmi_shm_result(g.shm, rank, view->epoch, value, &n) != 0)
        return PMI2_FAIL;
    *len = (int)n;
    return PMI2_SUCCESS;
}
