/* exit_early: a PMI-1 client written by hand (no MPI) that stops exactly
 * where a failure test wants it to. It talks the text protocol on PMI_FD.
 *
 *   exit_early MODE [TARGET [ARG]]
 *
 * TARGET (default 1, -1 for none) is the rank that misbehaves; every other
 * rank runs the normal conversation (init, get_maxes, get_my_kvsname, put,
 * barrier, get of the next rank's key, finalize) and prints
 * "early ok rank R" - or blocks in the barrier the target never reaches.
 *
 *   ok                 nobody misbehaves
 *   exit-before-init   TARGET exits with code ARG (default 3) before init
 *   kill-before-init   TARGET sends itself SIGKILL before init
 *   exit-after-put     TARGET exits with code ARG (default 0) after init
 *                      and put, before the barrier (no finalize)
 *   kill-after-put     TARGET sends itself SIGKILL after init and put
 *   close-after-put    TARGET closes PMI_FD after init and put and sleeps
 *                      ARG seconds (default 100): a rank that drops PMI
 *                      but keeps running
 *   no-finalize        TARGET runs the whole conversation but finalize,
 *                      sleeps ARG ms (default 300) so that it ends last,
 *                      and exits 0
 *   sleep-after-init   every rank inits, prints "ready rank R" and sleeps
 *                      ARG seconds (default 100); TARGET is ignored
 *
 * A rank still running after EXIT_EARLY_ALARM seconds (default 120) says
 * where it waited and exits 3, so a broken launcher leaves nothing behind
 * for long. Protocol errors go to stderr and exit 1. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank = -1, size = -1, fd = -1;
static const char *volatile phase = "start";

static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "exit_early: rank %d: %s: ", rank, phase);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void on_alarm(int sig)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "exit_early: rank %d: still waiting in %s\n", rank, phase);

    (void)sig;
    if (write(2, buf, n) < 0) {
        /* nothing left to do */
    }
    _exit(3);
}

/* send writes one command line (without its LF). */
static void send_cmd(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;

    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    buf[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write to PMI_FD: %s", strerror(errno));
        off += w;
    }
}

/* recv_cmd reads one response line into buf (without its LF), checks its
 * name is want and that rc, if present, is 0. */
static void recv_cmd(char *buf, size_t len, const char *want)
{
    size_t n = 0;

    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("read from PMI_FD: %s", strerror(errno));
        if (r == 0)
            die("EOF from the launcher while waiting for %s", want);
        if (c == '\n')
            break;
        if (n + 1 < len)
            buf[n++] = c;
    }
    buf[n] = '\0';
    size_t wl = strlen(want);
    if (strncmp(buf, "cmd=", 4) != 0 || strncmp(buf + 4, want, wl) != 0 || (buf[4 + wl] != ' ' && buf[4 + wl] != '\0'))
        die("got \"%s\", want cmd=%s", buf, want);
    const char *rc = strstr(buf, " rc=");
    if (rc != NULL && atoi(rc + 4) != 0)
        die("failed: \"%s\"", buf);
}

/* field copies the value of " name=" in line into out. */
static void field(const char *line, const char *name, char *out, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", name);
    const char *p = strstr(line, pat);
    if (p == NULL)
        die("no %s in \"%s\"", name, line);
    p += strlen(pat);
    size_t n = strcspn(p, " ");
    if (n >= len)
        die("%s too long in \"%s\"", name, line);
    memcpy(out, p, n);
    out[n] = '\0';
}

static char kvsname[512];

static void pmi_init_put(void)
{
    char line[2048];

    phase = "init";
    send_cmd("cmd=init pmi_version=1 pmi_subversion=1");
    recv_cmd(line, sizeof line, "response_to_init");
    phase = "get_maxes";
    send_cmd("cmd=get_maxes");
    recv_cmd(line, sizeof line, "maxes");
    phase = "get_my_kvsname";
    send_cmd("cmd=get_my_kvsname");
    recv_cmd(line, sizeof line, "my_kvsname");
    field(line, "kvsname", kvsname, sizeof kvsname);
    phase = "put";
    send_cmd("cmd=put kvsname=%s key=early-%d value=v-%d-of-%d", kvsname, rank, rank, size);
    recv_cmd(line, sizeof line, "put_result");
}

static void pmi_rest(int finalize)
{
    char line[2048], val[1100], want[64];
    int next = (rank + 1) % size;

    phase = "barrier";
    send_cmd("cmd=barrier_in");
    recv_cmd(line, sizeof line, "barrier_out");
    phase = "get";
    send_cmd("cmd=get kvsname=%s key=early-%d", kvsname, next);
    recv_cmd(line, sizeof line, "get_result");
    field(line, "value", val, sizeof val);
    snprintf(want, sizeof want, "v-%d-of-%d", next, size);
    if (strcmp(val, want) != 0)
        die("early-%d is \"%s\", want \"%s\"", next, val, want);
    if (!finalize)
        return;
    phase = "finalize";
    send_cmd("cmd=finalize");
    recv_cmd(line, sizeof line, "finalize_ack");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    int target = argc > 2 ? atoi(argv[2]) : 1;
    const char *arg = argc > 3 ? argv[3] : NULL;
    const char *e;

    signal(SIGALRM, on_alarm);
    e = getenv("EXIT_EARLY_ALARM");
    alarm(e != NULL ? atoi(e) : 120);

    if ((e = getenv("PMI_RANK")) == NULL)
        die("PMI_RANK not set");
    rank = atoi(e);
    if ((e = getenv("PMI_SIZE")) == NULL)
        die("PMI_SIZE not set");
    size = atoi(e);
    if ((e = getenv("PMI_FD")) == NULL)
        die("PMI_FD not set");
    fd = atoi(e);

    int me = rank == target;
    if (strcmp(mode, "ok") == 0) {
        me = 0;
    } else if (strcmp(mode, "exit-before-init") == 0) {
        if (me)
            exit(arg != NULL ? atoi(arg) : 3);
    } else if (strcmp(mode, "kill-before-init") == 0) {
        if (me)
            kill(getpid(), SIGKILL);
    } else if (strcmp(mode, "exit-after-put") == 0 || strcmp(mode, "kill-after-put") == 0) {
        if (me) {
            pmi_init_put();
            if (mode[0] == 'k')
                kill(getpid(), SIGKILL);
            exit(arg != NULL ? atoi(arg) : 0);
        }
    } else if (strcmp(mode, "close-after-put") == 0) {
        if (me) {
            pmi_init_put();
            close(fd);
            phase = "sleep after close";
            sleep(arg != NULL ? atoi(arg) : 100);
            return 0;
        }
    } else if (strcmp(mode, "no-finalize") == 0) {
        if (me) {
            pmi_init_put();
            pmi_rest(0);
            phase = "sleep without finalize";
            usleep((useconds_t)(arg != NULL ? atoi(arg) : 300) * 1000);
            return 0;
        }
    } else if (strcmp(mode, "sleep-after-init") == 0) {
        pmi_init_put();
        printf("ready rank %d\n", rank);
        fflush(stdout);
        phase = "sleep";
        sleep(arg != NULL ? atoi(arg) : 100);
        return 0;
    } else {
        die("unknown mode \"%s\"", mode);
    }

    pmi_init_put();
    pmi_rest(1);
    printf("early ok rank %d\n", rank);
    return 0;
}
