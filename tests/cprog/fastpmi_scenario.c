/* fastpmi_scenario: libfastpmi's extensions and the PMI-2 calls the Go
 * client also has, as one scenario whose results every rank prints as
 * canonical lines "r=<rank> <step> <result>". tests/e2e/conform runs the
 * same scenario through the Go client; the conformance test compares the
 * two outputs line for line. Built against fastpmi/pmi2ext.h and linked
 * with libfastpmi.
 *
 *   fastpmi_scenario            the scenario
 *   fastpmi_scenario plain      the first values without the ';' the
 *                               scenario puts to test the escape (Hydra
 *                               keeps no ';': the library refuses them)
 *   fastpmi_scenario nowait     without the get-with-wait of the next
 *                               rank's sparse key (visible on its node only)
 *   fastpmi_scenario withspawn  the scenario, and rank 0 spawns 2 copies of
 *                               /bin/true at its end ("r=0 spawn rc=0 job=N",
 *                               N the part of the job id after its last '-')
 *   fastpmi_scenario abort      rank 0 aborts after init (the others wait)
 *   fastpmi_scenario spawn [N]  rank 0 spawns 2 copies of /bin/true (with
 *                               an argument of N bytes, default 1) and
 *                               prints the return code and job id
 *   fastpmi_scenario threads    4 threads get every rank's key 200 times
 *                               while the main thread runs allgathers;
 *                               prints "r=<rank> threads ok"
 *   fastpmi_scenario agmany     5 iallgathers (the third a zero-copy view)
 *                               outstanding, waited for oldest first;
 *                               prints "r=<rank> agmany ok"
 *   fastpmi_scenario abortthread  rank 1's second thread (a watchdog: it
 *                               calls PMI2_Initialized, PMI2_Job_GetRank
 *                               and PMI2_Info_GetSize first) aborts while
 *                               its main thread waits in a fence rank 0
 *                               never enters (rank 0 sleeps 20 s)
 *   fastpmi_scenario abortexit  every rank aborts; an atexit handler calls
 *                               PMI2_Finalize and prints "atexit rc=<rc>"
 *   fastpmi_scenario skipfailed rank 0 waits for a key nobody puts while
 *                               the others fence (the deadlock check fails
 *                               both), then all fence: "r=<rank> after rc=<rc>"
 *   fastpmi_scenario longname   attribute and service names of 70000 bytes
 *                               are refused; then a fence: "r=<rank> longname ok"
 *   fastpmi_scenario agbig      allgathers of the largest values: 1023
 *                               bytes (PMIX_Allgather) and 1024 bytes with
 *                               NUL bytes (PMIX_Allgather_view), every
 *                               rank's checked: "r=<rank> agbig ok"
 *   fastpmi_scenario detached   rank 0 starts an iallgather, works 300 ms,
 *                               then puts the sparse key the others wait
 *                               for (no deadlock: it was not waiting); then
 *                               rank 0 waits in an ifence while the others
 *                               wait for a key nobody puts (a deadlock,
 *                               failed at once): "r=<rank> detached ok"
 *   fastpmi_scenario waittwice  an iallgather and an ifence, each waited
 *                               for, then waited for and tested again (a
 *                               request no longer outstanding: refused);
 *                               then a fence: "r=<rank> waittwice ok"
 *   fastpmi_scenario nodelay    the library's TCP connections (PMI_PORT)
 *                               have TCP_NODELAY (a request written while
 *                               another awaits its answer is not held for
 *                               the server's delayed ack): "r=<rank> nodelay
 *                               ok tcp=<connections found>"
 *   fastpmi_scenario staleview  three zero-copy allgathers: the first's
 *                               view is stale (PMIX_View_get fails), the
 *                               last two read: "r=<rank> staleview ok"
 *   fastpmi_scenario unfenced   before any fence, a get of the next rank's
 *                               key, then a waiting get of it (nobody
 *                               puts it): "r=<rank> unfenced get=<rc>
 *                               wait=<rc>"; both fail: not found, and
 *                               under fastpmi the waiting gets end as a
 *                               deadlock; under Hydra, whose PMI-2 server
 *                               ends the job on a get before the rank's
 *                               first fence, the library refuses both.
 *                               Then a fence and finalize
 *   fastpmi_scenario semicolon  a put of "a;b;c", a fence and a get of it:
 *                               "r=<rank> semicolon put=<rc> get=<rc>
 *                               val=<value>" (Hydra would keep "a":
 *                               the library refuses the put there)
 *   fastpmi_scenario finpending rank 0 starts an ifence and an iallgather
 *                               and finalizes without waiting for them;
 *                               the others fence and allgather:
 *                               "r=<rank> finpending ok"
 *   fastpmi_scenario fork       after a put and a fence a child is forked
 *                               that reads a job attribute and the next
 *                               rank's key; on shm an ifence is
 *                               outstanding, which the child fails to wait
 *                               for (the segment alone completes it; on a
 *                               shared socket the child would take the
 *                               parent's answer, as with Slurm's library);
 *                               then it finalizes (the rank stays its
 *                               parent's), and the parent waits for the
 *                               ifence, reads a job attribute and fences:
 *                               "r=<rank> fork ok"
 *
 * A failed call prints to stderr and exits 1. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/pmi2.h>

#include <fastpmi/pmi2ext.h>

static int me = -1;

static void check(int rc, const char *what)
{
    if (rc != PMI2_SUCCESS) {
        fprintf(stderr, "fastpmi_scenario: rank %d: %s failed: rc=%d\n", me, what, rc);
        exit(1);
    }
}

/* joined prints "r=<me> <step> " and the n strings of buf (stride
 * PMIX_MAX_VALLEN), comma-separated. */
static void joined(const char *step, const char *buf, int n)
{
    printf("r=%d %s ", me, step);
    for (int i = 0; i < n; i++)
        printf("%s%s", i ? "," : "", buf + (size_t)i * PMIX_MAX_VALLEN);
    printf("\n");
}

/* viewed prints a zero-copy allgather's view as step's line. */
static void viewed(const char *step, const PMIX_View *view, int n)
{
    printf("r=%d %s ", me, step);
    for (int r = 0; r < n; r++) {
        const char *v;
        int len;
        check(PMIX_View_get(view, r, &v, &len), "PMIX_View_get");
        printf("%s%.*s", r ? "," : "", len, v);
    }
    printf("\n");
}

static void get_all(const char *step, const char *prefix, int size, int wait)
{
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN), key[64];
    for (int r = 0; r < size; r++) {
        int len;
        snprintf(key, sizeof key, "%s-%d", prefix, r);
        if (wait)
            check(PMIX_KVS_Get_wait(NULL, r, key, buf + (size_t)r * PMIX_MAX_VALLEN, PMIX_MAX_VALLEN, &len),
                  "PMIX_KVS_Get_wait");
        else
            check(PMI2_KVS_Get(NULL, r, key, buf + (size_t)r * PMIX_MAX_VALLEN, PMIX_MAX_VALLEN, &len), "PMI2_KVS_Get");
    }
    joined(step, buf, size);
    free(buf);
}

static int nranks;

/* getter checks every rank's k-<r> 200 times (libpmi2 serialises calls). */
static void *getter(void *arg)
{
    char key[64], val[PMI2_MAX_VALLEN + 1], want[64];
    (void)arg;
    for (int i = 0; i < 200; i++)
        for (int r = 0; r < nranks; r++) {
            int len;
            snprintf(key, sizeof key, "k-%d", r);
            snprintf(want, sizeof want, "v-%d;x=y", r);
            check(PMI2_KVS_Get(NULL, r, key, val, sizeof val, &len), "PMI2_KVS_Get (thread)");
            if (strcmp(val, want) != 0) {
                fprintf(stderr, "fastpmi_scenario: rank %d: thread got %s=%s\n", me, key, val);
                exit(1);
            }
        }
    return NULL;
}

static void after_abort(void)
{
    int rc = PMI2_Finalize();
    printf("r=%d atexit rc=%d\n", me, rc);
    fflush(stdout);
}

/* aborter is a watchdog: it asks who it is, as one does before it
 * aborts a hung call, while the main thread waits in the fence. */
static void *aborter(void *arg)
{
    (void)arg;
    sleep(1);
    int rank = -1, size = -1;
    if (!PMI2_Initialized() || PMI2_Job_GetRank(&rank) != PMI2_SUCCESS || PMI2_Info_GetSize(&size) != PMI2_SUCCESS ||
        rank != me || size != 2)
        fprintf(stderr, "fastpmi_scenario: rank %d: the watchdog read rank %d of %d\n", me, rank, size);
    PMI2_Abort(1, "scenario abortthread");
    return NULL;
}

/* agmany starts 5 iallgathers (the third zero-copy) and waits for them
 * oldest first: results of epoch e must survive the start of e+2, e+4. */
static int agmany(int size)
{
    enum { N = 5 };
    PMIX_Request q[N];
    PMIX_View view;
    char *buf[N], v[64], w[64];
    for (int i = 0; i < N; i++) {
        buf[i] = calloc((size_t)size, PMIX_MAX_VALLEN);
        snprintf(v, sizeof v, "m%d-%d", i, me);
        if (i == 2)
            check(PMIX_Iallgather_view(v, (int)strlen(v), &view, &q[i]), "PMIX_Iallgather_view");
        else
            check(PMIX_Iallgather(v, buf[i], &q[i]), "PMIX_Iallgather");
    }
    for (int i = 0; i < N; i++) {
        check(PMIX_Wait(q[i]), "PMIX_Wait (agmany)");
        for (int r = 0; r < size; r++) {
            const char *got = buf[i] + (size_t)r * PMIX_MAX_VALLEN;
            int len = (int)strlen(got);
            if (i == 2)
                check(PMIX_View_get(&view, r, &got, &len), "PMIX_View_get (agmany)");
            snprintf(w, sizeof w, "m%d-%d", i, r);
            if (len != (int)strlen(w) || memcmp(got, w, (size_t)len) != 0) {
                fprintf(stderr, "fastpmi_scenario: rank %d: allgather %d gave %.*s for rank %d\n", me, i, len, got, r);
                return 1;
            }
        }
        free(buf[i]);
    }
    printf("r=%d agmany ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* bigval is rank r's value of n bytes for agbig: NUL bytes included
 * when bin. */
static void bigval(char *v, int r, int n, int bin)
{
    for (int i = 0; i < n; i++)
        v[i] = bin ? (char)((r * 7 + i) % 256) : (char)('a' + (r + i) % 26);
}

/* agbig: the largest values PMIX_Allgather and PMIX_Allgather_view take,
 * over every transport (the emulation under plain PMI-2 servers too). */
static int agbig(int size)
{
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN), v[PMIX_MAX_VALLEN + 1], w[PMIX_MAX_VALLEN + 1];
    bigval(v, me, PMIX_MAX_VALLEN - 1, 0);
    v[PMIX_MAX_VALLEN - 1] = '\0';
    check(PMIX_Allgather(v, buf), "PMIX_Allgather (1023 bytes)");
    for (int r = 0; r < size; r++) {
        bigval(w, r, PMIX_MAX_VALLEN - 1, 0);
        w[PMIX_MAX_VALLEN - 1] = '\0';
        if (memcmp(buf + (size_t)r * PMIX_MAX_VALLEN, w, PMIX_MAX_VALLEN) != 0)
            check(-1, "agbig: a value of 1023 bytes");
    }
    PMIX_View view;
    bigval(v, me, PMIX_MAX_VALLEN, 1);
    check(PMIX_Allgather_view(v, PMIX_MAX_VALLEN, &view), "PMIX_Allgather_view (1024 bytes)");
    for (int r = 0; r < size; r++) {
        const char *got;
        int n;
        check(PMIX_View_get(&view, r, &got, &n), "PMIX_View_get");
        bigval(w, r, PMIX_MAX_VALLEN, 1);
        if (n != PMIX_MAX_VALLEN || memcmp(got, w, PMIX_MAX_VALLEN) != 0)
            check(-1, "agbig: a view of 1024 bytes");
    }
    free(buf);
    printf("r=%d agbig ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* detached: see the top. */
static int detached(int size)
{
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN), v[PMI2_MAX_VALLEN + 1], mine[32];
    PMIX_Request q;
    int len;
    snprintf(mine, sizeof mine, "a%d", me);
    if (me == 0) {
        check(PMIX_Iallgather(mine, buf, &q), "PMIX_Iallgather (detached)");
        usleep(300 * 1000);
        check(PMIX_KVS_Put_hint("late", "put-after-work", PMIX_HINT_SPARSE), "PMIX_KVS_Put_hint (detached)");
        check(PMIX_Wait(q), "PMIX_Wait (detached)");
    } else {
        check(PMIX_KVS_Get_wait(NULL, 0, "late", v, sizeof v, &len), "PMIX_KVS_Get_wait (detached)");
        if (strcmp(v, "put-after-work") != 0)
            check(-1, "PMIX_KVS_Get_wait (detached): the value");
        check(PMIX_Allgather(mine, buf), "PMIX_Allgather (detached)");
    }
    for (int r = 0; r < size; r++) {
        char w[32];
        snprintf(w, sizeof w, "a%d", r);
        if (strcmp(buf + (size_t)r * PMIX_MAX_VALLEN, w) != 0)
            check(-1, "detached: the allgather's values");
    }
    free(buf);
    int rc;
    if (me == 0) {
        check(PMIX_KVS_Ifence(&q), "PMIX_KVS_Ifence (detached)");
        rc = PMIX_Wait(q);
    } else {
        rc = PMIX_KVS_Get_wait(NULL, 0, "never-put", v, sizeof v, &len);
    }
    if (rc == PMI2_SUCCESS)
        check(-1, "detached: a deadlock that did not fail");
    printf("r=%d detached ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* waittwice: see the top. */
static int waittwice(int size)
{
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN);
    PMIX_Request q[2];
    int done;
    check(PMIX_Iallgather("twice", buf, &q[0]), "PMIX_Iallgather (waittwice)");
    check(PMIX_KVS_Ifence(&q[1]), "PMIX_KVS_Ifence (waittwice)");
    for (int i = 0; i < 2; i++)
        check(PMIX_Wait(q[i]), "PMIX_Wait (waittwice)");
    for (int i = 0; i < 2; i++)
        if (PMIX_Wait(q[i]) != PMI2_ERR_INVALID_ARG || PMIX_Test(q[i], &done) != PMI2_ERR_INVALID_ARG)
            check(-1, "waittwice: a request waited for already was not refused");
    free(buf);
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (waittwice)");
    printf("r=%d waittwice ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* nodelay: see the top. */
static int nodelay(void)
{
    int tcp = 0;
    for (int fd = 0; fd < 1024; fd++) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int type, on = 0;
        socklen_t tl = sizeof type, ol = sizeof on;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM ||
            getsockname(fd, (struct sockaddr *)&a, &al) != 0 || (a.ss_family != AF_INET && a.ss_family != AF_INET6))
            continue;
        tcp++;
        if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &ol) != 0 || !on)
            check(-1, "nodelay: a TCP connection without TCP_NODELAY");
    }
    printf("r=%d nodelay ok tcp=%d\n", me, tcp);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* staleview: see the top. */
static int staleview(void)
{
    PMIX_View v[3];
    const char *got;
    int len;
    check(PMIX_Allgather_view("va", 2, &v[0]), "PMIX_Allgather_view (staleview)");
    check(PMIX_Allgather_view("vb", 2, &v[1]), "PMIX_Allgather_view (staleview)");
    check(PMIX_Allgather_view("vc", 2, &v[2]), "PMIX_Allgather_view (staleview)");
    if (PMIX_View_get(&v[0], 0, &got, &len) == PMI2_SUCCESS)
        check(-1, "staleview: a view two collectives old was read");
    for (int i = 1; i < 3; i++) {
        check(PMIX_View_get(&v[i], 0, &got, &len), "PMIX_View_get (staleview)");
        if (len != 2 || got[0] != 'v' || got[1] != "abc"[i])
            check(-1, "staleview: the value");
    }
    printf("r=%d staleview ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* finpending: see the top. */
static int finpending(int size)
{
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN);
    if (me == 0) {
        PMIX_Request q[2];
        check(PMIX_KVS_Ifence(&q[0]), "PMIX_KVS_Ifence (finpending)");
        check(PMIX_Iallgather("fp", buf, &q[1]), "PMIX_Iallgather (finpending)");
    } else {
        check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (finpending)");
        check(PMIX_Allgather("fp", buf), "PMIX_Allgather (finpending)");
    }
    check(PMI2_Finalize(), "PMI2_Finalize (finpending)");
    printf("r=%d finpending ok\n", me);
    return 0;
}

/* forked: see the top ("fork"). */
static int forked(int size)
{
    char key[32], val[PMI2_MAX_VALLEN + 1];
    int found = 0, len, st;
    snprintf(key, sizeof key, "fk-%d", me);
    check(PMI2_KVS_Put(key, "before-fork"), "PMI2_KVS_Put (fork)");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (fork)");
    PMIX_Request q = NULL;
    int onshm = strcmp(PMIX_Transport(), "shm") == 0;
    if (onshm)
        check(PMIX_KVS_Ifence(&q), "PMIX_KVS_Ifence (fork)");
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        snprintf(key, sizeof key, "fk-%d", (me + 1) % size);
        if (PMI2_Info_GetJobAttr("universeSize", val, sizeof val, &found) != PMI2_SUCCESS || !found ||
            PMI2_KVS_Get(NULL, PMI2_ID_NULL, key, val, sizeof val, &len) != PMI2_SUCCESS ||
            strcmp(val, "before-fork") != 0 || (onshm && PMIX_Wait(q) == PMI2_SUCCESS) ||
            PMI2_Finalize() != PMI2_SUCCESS)
            _exit(1);
        _exit(0);
    }
    if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        check(-1, "fork: the child's calls");
    if (onshm)
        check(PMIX_Wait(q), "PMIX_Wait (fork)");
    check(PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof val, &found), "PMI2_Info_GetJobAttr (fork)");
    if (!found || strncmp(val, "(vector", 7) != 0)
        check(-1, "fork: the parent's job attribute");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (fork)");
    printf("r=%d fork ok\n", me);
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

/* unfenced: gets before the rank's first fence (see the top). */
static int unfenced(int size)
{
    char key[64], val[PMI2_MAX_VALLEN + 1];
    int len;
    snprintf(key, sizeof key, "unfenced-%d", (me + 1) % size);
    int get = PMI2_KVS_Get(NULL, (me + 1) % size, key, val, sizeof val, &len);
    int wait = PMIX_KVS_Get_wait(NULL, (me + 1) % size, key, val, sizeof val, &len);
    printf("r=%d unfenced get=%d wait=%d\n", me, get, wait);
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (unfenced)");
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}

int main(int argc, char **argv)
{
    int spawned, size, appnum, found, rc;
    char key[64], val[PMI2_MAX_VALLEN + 1];
    const char *mode = argc > 1 ? argv[1] : "";
    int nowait = 0, withspawn = 0, plain = 0;
    for (int i = 1; i < argc; i++) {
        nowait |= strcmp(argv[i], "nowait") == 0;
        withspawn |= strcmp(argv[i], "withspawn") == 0;
        plain |= strcmp(argv[i], "plain") == 0;
    }

    check(PMI2_Init(&spawned, &size, &me, &appnum), "PMI2_Init");
    printf("r=%d init size=%d transport=%s\n", me, size, PMIX_Transport());

    if (strcmp(mode, "abortexit") == 0) {
        atexit(after_abort);
        PMI2_Abort(1, "scenario abortexit");
        return 2;
    }
    if (strcmp(mode, "abortthread") == 0) {
        if (me == 0) {
            sleep(20);
            PMI2_Finalize();
            return 0;
        }
        pthread_t th;
        pthread_create(&th, NULL, aborter, NULL);
        rc = PMI2_KVS_Fence();
        printf("r=%d fence rc=%d\n", me, rc);
        return 2;
    }
    if (strcmp(mode, "agmany") == 0)
        return agmany(size);
    if (strcmp(mode, "agbig") == 0)
        return agbig(size);
    if (strcmp(mode, "detached") == 0)
        return detached(size);
    if (strcmp(mode, "waittwice") == 0)
        return waittwice(size);
    if (strcmp(mode, "fork") == 0)
        return forked(size);
    if (strcmp(mode, "finpending") == 0)
        return finpending(size);
    if (strcmp(mode, "unfenced") == 0)
        return unfenced(size);
    if (strcmp(mode, "semicolon") == 0) {
        int len = 0;
        snprintf(key, sizeof key, "semi-%d", me);
        int put = PMI2_KVS_Put(key, "a;b;c");
        check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (semicolon)");
        val[0] = '\0';
        int get = PMI2_KVS_Get(NULL, me, key, val, sizeof val, &len);
        printf("r=%d semicolon put=%d get=%d val=%s\n", me, put, get, get == PMI2_SUCCESS ? val : "");
        check(PMI2_Finalize(), "PMI2_Finalize");
        return 0;
    }
    if (strcmp(mode, "staleview") == 0)
        return staleview();
    if (strcmp(mode, "nodelay") == 0)
        return nodelay();
    if (strcmp(mode, "skipfailed") == 0) {
        int len;
        setvbuf(stdout, NULL, _IONBF, 0);
        if (me == 0)
            rc = PMIX_KVS_Get_wait(NULL, 1, "never-put", val, sizeof val, &len);
        else
            rc = PMI2_KVS_Fence();
        printf("r=%d failed rc=%d\n", me, rc != PMI2_SUCCESS);
        rc = PMI2_KVS_Fence();
        printf("r=%d after rc=%d\n", me, rc);
        check(PMI2_Finalize(), "PMI2_Finalize");
        return 0;
    }
    if (strcmp(mode, "longname") == 0) {
        char *ln = malloc(70001);
        memset(ln, 'n', 70000);
        ln[70000] = '\0';
        if (PMI2_Info_GetNodeAttr(ln, val, sizeof val, &found, 0) == PMI2_SUCCESS ||
            PMI2_Info_GetJobAttr(ln, val, sizeof val, &found) == PMI2_SUCCESS ||
            PMI2_Nameserv_publish(ln, NULL, "port") == PMI2_SUCCESS ||
            PMI2_Nameserv_lookup(ln, NULL, val, sizeof val) == PMI2_SUCCESS) {
            fprintf(stderr, "fastpmi_scenario: rank %d: a 70000-byte name was accepted\n", me);
            return 1;
        }
        free(ln);
        check(PMI2_KVS_Fence(), "PMI2_KVS_Fence (longname)");
        printf("r=%d longname ok\n", me);
        check(PMI2_Finalize(), "PMI2_Finalize");
        return 0;
    }
    if (strcmp(mode, "abort") == 0) {
        if (me == 0)
            PMI2_Abort(1, "scenario abort");
        sleep(30);
        return 2;
    }
    if (strcmp(mode, "spawn") == 0) {
        if (me == 0) {
            const char *cmds[] = {"/bin/true"};
            int argcs[] = {1}, maxprocs[] = {2}, nkeys[] = {0}, errors[2] = {0, 0};
            /* "spawn N": the argument is N bytes long (a request larger
             * than a shared-memory ring message). */
            int n = argc > 2 ? atoi(argv[2]) : 1;
            char *x = malloc((size_t)n + 1);
            memset(x, 'x', (size_t)n);
            x[n] = '\0';
            const char *args[] = {x, NULL};
            const char **argvs[] = {args};
            char jobid[64] = "";
            rc = PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, nkeys, NULL, 0, NULL, jobid, sizeof jobid, errors);
            printf("r=%d spawn rc=%d jobid=%s\n", me, rc, jobid);
            free(x);
        }
        check(PMI2_Finalize(), "PMI2_Finalize");
        return 0;
    }

    /* put, fence, get of every rank's key */
    snprintf(key, sizeof key, "k-%d", me);
    snprintf(val, sizeof val, plain ? "v-%d" : "v-%d;x=y", me);
    check(PMI2_KVS_Put(key, val), "PMI2_KVS_Put");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    get_all("get", "k", size, 0);

    if (strcmp(mode, "threads") == 0) {
        pthread_t th[4];
        nranks = size;
        for (int i = 0; i < 4; i++)
            pthread_create(&th[i], NULL, getter, NULL);
        char *b = calloc((size_t)size, PMIX_MAX_VALLEN);
        for (int i = 0; i < 20; i++) {
            snprintf(val, sizeof val, "t%d-%d", i, me);
            check(PMIX_Allgather(val, b), "PMIX_Allgather (threads)");
            for (int r = 0; r < size; r++) {
                char w[64];
                snprintf(w, sizeof w, "t%d-%d", i, r);
                if (strcmp(b + (size_t)r * PMIX_MAX_VALLEN, w) != 0) {
                    fprintf(stderr, "fastpmi_scenario: rank %d: allgather %d gave %s for rank %d\n", me, i,
                            b + (size_t)r * PMIX_MAX_VALLEN, r);
                    exit(1);
                }
            }
        }
        for (int i = 0; i < 4; i++)
            pthread_join(th[i], NULL);
        free(b);
        printf("r=%d threads ok\n", me);
        check(PMI2_Finalize(), "PMI2_Finalize");
        return 0;
    }

    /* blocking allgather */
    char *buf = calloc((size_t)size, PMIX_MAX_VALLEN);
    snprintf(val, sizeof val, "ag-%d", me);
    check(PMIX_Allgather(val, buf), "PMIX_Allgather");
    joined("allgather", buf, size);

    /* zero-copy allgather */
    PMIX_View view;
    snprintf(val, sizeof val, "zc-%d", me);
    check(PMIX_Allgather_view(val, (int)strlen(val), &view), "PMIX_Allgather_view");
    viewed("view", &view, size);

    /* an ifence and an iallgather outstanding together, waited for in
     * the other order */
    snprintf(key, sizeof key, "f-%d", me);
    snprintf(val, sizeof val, "fv-%d", me);
    check(PMIX_KVS_Put_hint(key, val, PMIX_HINT_DENSE), "PMIX_KVS_Put_hint");
    PMIX_Request fence, ag;
    check(PMIX_KVS_Ifence(&fence), "PMIX_KVS_Ifence");
    snprintf(val, sizeof val, "iag-%d", me);
    memset(buf, 'X', (size_t)size * PMIX_MAX_VALLEN);
    check(PMIX_Iallgather(val, buf, &ag), "PMIX_Iallgather");
    strcpy(val, "changed"); /* the value was taken at the start */
    check(PMIX_Wait(ag), "PMIX_Wait(iallgather)");
    check(PMIX_Wait(fence), "PMIX_Wait(ifence)");
    joined("iallgather", buf, size);
    get_all("ifence-get", "f", size, 0);

    /* a zero-copy iallgather and an ifence outstanding together, the view
     * read once its request is waited for */
    {
        PMIX_View iv;
        PMIX_Request vq, fq;
        snprintf(val, sizeof val, "iv-%d", me);
        check(PMIX_Iallgather_view(val, (int)strlen(val), &iv, &vq), "PMIX_Iallgather_view");
        check(PMIX_KVS_Ifence(&fq), "PMIX_KVS_Ifence");
        check(PMIX_Wait(fq), "PMIX_Wait(ifence)");
        check(PMIX_Wait(vq), "PMIX_Wait(iallgather view)");
        viewed("iview", &iv, size);
    }

    /* a put without a fence read with get-with-wait: each rank waits for
     * the next rank's key */
    snprintf(key, sizeof key, "w-%d", me);
    snprintf(val, sizeof val, "wv-%d", me);
    check(PMIX_KVS_Put_hint(key, val, PMIX_HINT_SPARSE), "PMIX_KVS_Put_hint(sparse)");
    if (!nowait) {
        int len, nx = (me + 1) % size;
        snprintf(key, sizeof key, "w-%d", nx);
        check(PMIX_KVS_Get_wait(NULL, nx, key, val, sizeof val, &len), "PMIX_KVS_Get_wait");
        printf("r=%d getwait %s\n", me, val);
    }

    /* ring */
    {
        int pos, n;
        char left[PMI2_MAX_VALLEN + 1], right[PMI2_MAX_VALLEN + 1];
        snprintf(val, sizeof val, "ring-%d", me);
        check(PMIX_Ring(val, &pos, &n, left, right, PMI2_MAX_VALLEN), "PMIX_Ring");
        printf("r=%d ring pos=%d size=%d left=%s right=%s\n", me, pos, n, left, right);
    }

    /* job attribute */
    found = 0;
    check(PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof val, &found), "PMI2_Info_GetJobAttr");
    printf("r=%d mapping found=%d %s\n", me, found, found ? val : "");

    /* node attributes: every rank puts the same one (a repeated put
     * replaces), a fence, then each reads it and a missing one */
    check(PMI2_Info_PutNodeAttr("na", "node-shared"), "PMI2_Info_PutNodeAttr");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    found = 0;
    check(PMI2_Info_GetNodeAttr("na", val, sizeof val, &found, 1), "PMI2_Info_GetNodeAttr(wait)");
    {
        char miss[PMI2_MAX_VALLEN + 1];
        int mfound = 0;
        check(PMI2_Info_GetNodeAttr("na-missing", miss, sizeof miss, &mfound, 0), "PMI2_Info_GetNodeAttr");
        printf("r=%d nodeattr found=%d %s missing=%d\n", me, found, found ? val : "", mfound);
    }

    /* names: rank 0 publishes, everyone looks up, rank 0 unpublishes */
    if (me == 0)
        check(PMI2_Nameserv_publish("scenario-svc", NULL, "port-0"), "PMI2_Nameserv_publish");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    val[0] = '\0';
    rc = PMI2_Nameserv_lookup("scenario-svc", NULL, val, sizeof val);
    printf("r=%d lookup rc=%d %s\n", me, rc != PMI2_SUCCESS, rc == PMI2_SUCCESS ? val : "");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    if (me == 0)
        check(PMI2_Nameserv_unpublish("scenario-svc", NULL), "PMI2_Nameserv_unpublish");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    rc = PMI2_Nameserv_lookup("scenario-svc", NULL, val, sizeof val);
    printf("r=%d lookup-after-unpublish found=%d\n", me, rc == PMI2_SUCCESS);

    /* a get of a key nobody put fails */
    int len;
    rc = PMI2_KVS_Get(NULL, PMI2_ID_NULL, "no-such-key", val, sizeof val, &len);
    printf("r=%d missing found=%d\n", me, rc == PMI2_SUCCESS);

    if (withspawn && me == 0) {
        const char *cmds[] = {"/bin/true"};
        int argcs[] = {0}, maxprocs[] = {2}, nkeys[] = {0}, errors[1] = {0};
        const char **argvs[] = {NULL};
        char jobid[64] = "";
        rc = PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, nkeys, NULL, 0, NULL, jobid, sizeof jobid, errors);
        const char *dash = strrchr(jobid, '-');
        printf("r=%d spawn rc=%d job=%s\n", me, rc, dash != NULL ? dash + 1 : jobid);
    }

    check(PMI2_Finalize(), "PMI2_Finalize");
    free(buf);
    return 0;
}
