/* wire.c: the PMI-2 text protocol's framing (pmi-wire.md section 5). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fpmi.h"

int fpmi_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

long fpmi_frame_len(const char hdr[6])
{
    long v = 0;
    int i = 0, digits = 0;

    while (i < 6 && hdr[i] == ' ')
        i++;
    for (; i < 6 && hdr[i] >= '0' && hdr[i] <= '9'; i++, digits++)
        v = v * 10 + (hdr[i] - '0');
    while (i < 6 && hdr[i] == ' ')
        i++;
    if (i != 6 || digits == 0)
        return -1;
    return v;
}

void fpmi_msg_free(struct fpmi_msg *m)
{
    free(m->body);
    free(m->pairs);
    memset(m, 0, sizeof *m);
}

/* unescape reads one token of s[i..n) up to an unescaped stop ('=' for
 * keys, which cannot hold ';', or ';'), writing it NUL-terminated at
 * out (out <= s+i, so in place is safe). It returns the index after the
 * stop, or -1 if the body ends first. */
static long token(char *s, size_t n, size_t i, char stop, char *out, size_t *len)
{
    size_t o = 0;
    while (i < n) {
        char c = s[i];
        if (c == ';' && stop == ';') {
            if (i + 1 < n && s[i + 1] == ';') {
                out[o++] = ';';
                i += 2;
                continue;
            }
            out[o] = '\0';
            *len = o;
            return (long)(i + 1);
        }
        if (c == stop || c == ';' || c == '\0') {
            if (c != stop)
                return -1;
            out[o] = '\0';
            *len = o;
            return (long)(i + 1);
        }
        out[o++] = c;
        i++;
    }
    return -1;
}

int fpmi_wire_parse(char *body, size_t n, struct fpmi_msg *m)
{
    size_t i = 0, cap = 8, klen, vlen;

    memset(m, 0, sizeof *m);
    body[n] = '\0';
    m->body = body;
    m->pairs = malloc(cap * sizeof *m->pairs);
    if (m->pairs == NULL)
        goto bad;
    while (i < n) {
        char *k = body + i;
        long j = token(body, n, i, '=', k, &klen);
        if (j < 0 || klen == 0)
            goto bad;
        char *v = body + j;
        long e = token(body, n, (size_t)j, ';', v, &vlen);
        if (e < 0)
            goto bad;
        i = (size_t)e;
        if (m->cmd == NULL) {
            if (strcmp(k, "cmd") != 0 || vlen == 0)
                goto bad;
            m->cmd = v;
            continue;
        }
        if ((size_t)m->npairs == cap) {
            struct fpmi_pair *p = realloc(m->pairs, 2 * cap * sizeof *p);
            if (p == NULL)
                goto bad;
            m->pairs = p;
            cap *= 2;
        }
        m->pairs[m->npairs++] = (struct fpmi_pair){k, v, vlen};
    }
    if (m->cmd == NULL)
        goto bad;
    return 0;
bad:
    fpmi_msg_free(m);
    return -1;
}

const char *fpmi_msg_get(const struct fpmi_msg *m, const char *key, size_t *vlen)
{
    for (int i = 0; i < m->npairs; i++)
        if (strcmp(m->pairs[i].key, key) == 0) {
            if (vlen != NULL)
                *vlen = m->pairs[i].vlen;
            return m->pairs[i].val;
        }
    return NULL;
}

static void put(struct fpmi_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* putval appends s with every ';' doubled (the PMI-2 escape). */
static void putval(struct fpmi_buf *b, const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ';') {
            put(b, s + start, i + 1 - start);
            put(b, ";", 1);
            start = i + 1;
        }
    put(b, s + start, n - start);
}

void fpmi_buf_start(struct fpmi_buf *b, const char *cmd)
{
    b->n = 0;
    b->oom = 0;
    put(b, "      cmd=", 10);
    putval(b, cmd, strlen(cmd));
    put(b, ";", 1);
}

void fpmi_buf_pair(struct fpmi_buf *b, const char *key, const char *val, size_t vlen)
{
    put(b, key, strlen(key));
    put(b, "=", 1);
    putval(b, val, vlen);
    put(b, ";", 1);
}

void fpmi_buf_pairs(struct fpmi_buf *b, const char *key, const char *val)
{
    fpmi_buf_pair(b, key, val ? val : "", val ? strlen(val) : 0);
}

void fpmi_buf_pairi(struct fpmi_buf *b, const char *key, long v)
{
    char s[32];
    int n = snprintf(s, sizeof s, "%ld", v);
    fpmi_buf_pair(b, key, s, (size_t)n);
}

int fpmi_buf_finish(struct fpmi_buf *b)
{
    char hdr[8];
    if (b->oom || b->n - 6 > FPMI_FRAME_MAX)
        return -1;
    snprintf(hdr, sizeof hdr, "%-6lu", (unsigned long)(b->n - 6));
    memcpy(b->p, hdr, 6);
    return 0;
}

void fpmi_buf_free(struct fpmi_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
