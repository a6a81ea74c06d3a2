/* text.c: requests over the PMI-2 text protocol (pmi-wire.md), on the
 * PMI_FD socket the launcher gave (or a PMI_PORT connection). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fpmi.h"

struct fpmi_text {
    int fd;
    /* wmu orders whole frames on fd: held by fpmi_text_send's write and by
     * fpmi_text_write (PMI2_Abort, without the API's mutex). Never held
     * while reading. A zero pthread_mutex_t is an unlocked default mutex. */
    pthread_mutex_t wmu;
    uint32_t next;
    struct fpmi_treq *pending; /* outstanding, oldest first */
    char rbuf[16384];
    size_t rstart, rend; /* unread bytes: rbuf[rstart..rend) */
    struct fpmi_buf wbuf;
};

#define fail fpmi_errf

/* text_store is the process's first connection, in .bss: a calloc of
 * the 16 KiB read buffer would clear (and fault in) every page of it at
 * PMI2_Init, where a page fault costs tens of microseconds on a loaded or
 * virtual machine; here only the pages a read fills are touched. Further
 * connections (a second open while the first is in use) are allocated. */
static struct fpmi_text text_store;
static int text_store_used; /* atomic: text_store belongs to an open connection */

struct fpmi_text *fpmi_text_open(int fd)
{
    struct fpmi_text *t;
    if (!__atomic_exchange_n(&text_store_used, 1, __ATOMIC_ACQ_REL))
        t = &text_store; /* zero but for rbuf's old bytes: fpmi_text_close */
    else if ((t = calloc(1, sizeof *t)) == NULL)
        return NULL;
    t->fd = fd;
    return t;
}

void fpmi_treq_free(struct fpmi_treq *r)
{
    if (r == NULL)
        return;
    fpmi_msg_free(&r->resp);
    free(r);
}

void fpmi_text_close(struct fpmi_text *t)
{
    if (t == NULL)
        return;
    /* Outstanding requests belong to their senders; unlink them. */
    for (struct fpmi_treq *r = t->pending; r != NULL; r = r->next)
        r->done = 1, r->rc = -1;
    close(t->fd);
    fpmi_buf_free(&t->wbuf);
    if (t != &text_store) {
        free(t);
        return;
    }
    /* Zero every field but the read buffer (read only below rend). */
    t->fd = -1;
    t->next = 0;
    t->pending = NULL;
    t->rstart = t->rend = 0;
    memset(&t->wbuf, 0, sizeof t->wbuf);
    memset(&t->wmu, 0, sizeof t->wmu);
    __atomic_store_n(&text_store_used, 0, __ATOMIC_RELEASE);
}

int fpmi_text_fd(const struct fpmi_text *t) { return t->fd; }

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* fill reads more bytes into rbuf; -1 at end of file or error. */
static int fill(struct fpmi_text *t, char *err, size_t errlen)
{
    if (t->rstart > 0) {
        memmove(t->rbuf, t->rbuf + t->rstart, t->rend - t->rstart);
        t->rend -= t->rstart;
        t->rstart = 0;
    }
    for (;;) {
        ssize_t n = read(t->fd, t->rbuf + t->rend, sizeof t->rbuf - t->rend);
        if (n > 0) {
            t->rend += (size_t)n;
            return 0;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            return fail(err, errlen, "the launcher closed the PMI connection");
        return fail(err, errlen, "read PMI connection: %s", strerror(errno));
    }
}

/* read_exact copies n bytes into p. */
static int read_exact(struct fpmi_text *t, char *p, size_t n, char *err, size_t errlen)
{
    while (n > 0) {
        if (t->rstart == t->rend && fill(t, err, errlen) != 0)
            return -1;
        size_t k = t->rend - t->rstart;
        if (k > n)
            k = n;
        memcpy(p, t->rbuf + t->rstart, k);
        t->rstart += k;
        p += k;
        n -= k;
    }
    return 0;
}

/* read_frame reads one PMI-2 frame and parses it into m. */
static int read_frame(struct fpmi_text *t, struct fpmi_msg *m, char *err, size_t errlen)
{
    char hdr[6];
    if (read_exact(t, hdr, 6, err, errlen) != 0)
        return -1;
    long n = fpmi_frame_len(hdr);
    if (n < 0)
        return fail(err, errlen, "bad PMI-2 length header \"%.6s\"", hdr);
    char *body = malloc((size_t)n + 1);
    if (body == NULL)
        return fail(err, errlen, "out of memory");
    if (read_exact(t, body, (size_t)n, err, errlen) != 0) {
        free(body);
        return -1;
    }
    if (fpmi_wire_parse(body, (size_t)n, m) != 0)
        return fail(err, errlen, "malformed PMI-2 response");
    return 0;
}

/* read_line reads a PMI-1 line (the answer to init) into line. */
static int read_line(struct fpmi_text *t, char *line, size_t max, char *err, size_t errlen)
{
    size_t o = 0;
    for (;;) {
        if (t->rstart == t->rend && fill(t, err, errlen) != 0)
            return -1;
        char c = t->rbuf[t->rstart++];
        if (c == '\n') {
            line[o] = '\0';
            return 0;
        }
        if (o + 1 >= max)
            return fail(err, errlen, "PMI-1 line longer than %zu bytes", max);
        line[o++] = c;
    }
}

/* v1_get finds " key=value" in a PMI-1 line; value up to the next space. */
static const char *v1_get(const char *line, const char *key, char *out, size_t max)
{
    size_t kl = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += kl) {
        if ((p != line && p[-1] != ' ') || p[kl] != '=')
            continue;
        p += kl + 1;
        size_t n = strcspn(p, " ");
        if (n >= max)
            n = max - 1;
        memcpy(out, p, n);
        out[n] = '\0';
        return out;
    }
    return NULL;
}

struct fpmi_treq *fpmi_text_send(struct fpmi_text *t, struct fpmi_buf *b, const char *cmd, char *err, size_t errlen)
{
    struct fpmi_treq *r = calloc(1, sizeof *r);
    if (r == NULL) {
        fail(err, errlen, "out of memory");
        return NULL;
    }
    r->id = ++t->next;
    snprintf(r->cmd, sizeof r->cmd, "%s", cmd);
    fpmi_buf_pairi(b, "thrid", r->id);
    if (fpmi_buf_finish(b) != 0) {
        free(r);
        fail(err, errlen, "%s request too long", cmd);
        return NULL;
    }
    pthread_mutex_lock(&t->wmu);
    int w = write_all(t->fd, b->p, b->n);
    pthread_mutex_unlock(&t->wmu);
    if (w != 0) {
        free(r);
        fail(err, errlen, "send %s: %s", cmd, strerror(errno));
        return NULL;
    }
    struct fpmi_treq **pp = &t->pending;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = r;
    return r;
}

int fpmi_text_write(struct fpmi_text *t, struct fpmi_buf *b)
{
    if (t == NULL || fpmi_buf_finish(b) != 0)
        return -1;
    return fpmi_text_write_raw(t, b->p, b->n);
}

int fpmi_text_write_raw(struct fpmi_text *t, const char *p, size_t n)
{
    if (t == NULL)
        return -1;
    /* A frame being written by another thread is finished first: wait for
     * it, at most a second (a peer that stopped reading). */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec++;
    if (pthread_mutex_timedlock(&t->wmu, &until) != 0)
        return -1;
    int rc = write_all(t->fd, p, n);
    pthread_mutex_unlock(&t->wmu);
    return rc;
}

int fpmi_text_notify(struct fpmi_text *t, struct fpmi_buf *b)
{
    if (t == NULL)
        return -1;
    fpmi_buf_pairi(b, "thrid", ++t->next);
    return fpmi_text_write(t, b);
}

int fpmi_text_progress(struct fpmi_text *t, char *err, size_t errlen)
{
    struct fpmi_msg m;
    if (read_frame(t, &m, err, errlen) != 0)
        return -1;
    struct fpmi_treq **pp = &t->pending;
    const char *th = fpmi_msg_get(&m, "thrid", NULL);
    if (th != NULL) {
        char *end;
        unsigned long id = strtoul(th, &end, 10);
        while (*pp != NULL && (*end != '\0' || (*pp)->id != id))
            pp = &(*pp)->next;
    } else {
        /* No thrid (Slurm): the oldest request this response answers, by
         * name (a put is answered at once while a fence is outstanding),
         * else the oldest. */
        size_t n = strlen(m.cmd);
        for (struct fpmi_treq **q = pp; *q != NULL; q = &(*q)->next)
            if (n > 9 && strcmp(m.cmd + n - 9, "-response") == 0 && strlen((*q)->cmd) == n - 9 &&
                strncmp(m.cmd, (*q)->cmd, n - 9) == 0) {
                pp = q;
                break;
            }
    }
    struct fpmi_treq *r = *pp;
    if (r == NULL) {
        int rc = fail(err, errlen, "unexpected PMI-2 response %s", m.cmd);
        fpmi_msg_free(&m);
        return rc;
    }
    *pp = r->next;
    r->next = NULL;
    r->resp = m;
    r->done = 1;
    char want[64];
    snprintf(want, sizeof want, "%s-response", r->cmd);
    const char *rc = fpmi_msg_get(&m, "rc", NULL);
    if (strcmp(m.cmd, want) != 0)
        r->rc = -1;
    else
        r->rc = rc != NULL && *rc != '\0' ? atoi(rc) : 0;
    return 0;
}

int fpmi_text_call(struct fpmi_text *t, struct fpmi_buf *b, const char *cmd, struct fpmi_treq **out, char *err,
                   size_t errlen)
{
    struct fpmi_treq *r = fpmi_text_send(t, b, cmd, err, errlen);
    if (r == NULL)
        return -1;
    while (!r->done)
        if (fpmi_text_progress(t, err, errlen) != 0) {
            /* r stays linked; the transport is broken from here on. */
            return -1;
        }
    *out = r;
    return 0;
}

int fpmi_text_init(struct fpmi_text *t, const char *pmiid, const char *jobid, struct fpmi_treq **resp, char *err,
                   size_t errlen)
{
    static const char init[] = "cmd=init pmi_version=2 pmi_subversion=0\n";
    char line[1024], v[64];
    if (write_all(t->fd, init, sizeof init - 1) != 0)
        return fail(err, errlen, "send init: %s", strerror(errno));
    if (read_line(t, line, sizeof line, err, errlen) != 0)
        return -1;
    if (strncmp(line, "cmd=response_to_init", 20) != 0 || (v1_get(line, "rc", v, sizeof v) && strcmp(v, "0") != 0))
        return fail(err, errlen, "launcher refused PMI-2: %s", line);
    struct fpmi_buf *b = &t->wbuf;
    fpmi_buf_start(b, "fullinit");
    if (jobid != NULL && *jobid != '\0')
        fpmi_buf_pairs(b, "pmijobid", jobid);
    if (pmiid != NULL)
        fpmi_buf_pairs(b, "pmirank", pmiid);
    fpmi_buf_pairs(b, "threaded", "FALSE");
    struct fpmi_treq *r;
    if (fpmi_text_call(t, b, "fullinit", &r, err, errlen) != 0)
        return -1;
    if (r->rc != 0) {
        const char *m = fpmi_msg_get(&r->resp, "errmsg", NULL);
        fail(err, errlen, "fullinit failed (rc=%d): %s", r->rc, m ? m : "");
        fpmi_treq_free(r);
        return -1;
    }
    *resp = r;
    return 0;
}

int fpmi_text_drain(struct fpmi_text *t, char *err, size_t errlen)
{
    while (t->pending != NULL)
        if (fpmi_text_progress(t, err, errlen) != 0)
            return -1;
    return 0;
}
