/* pmix_dmodex: a PMIx client whose peers' data is read by direct modex.
 * Every rank puts a key (PMIX_GLOBAL, 2000 bytes: more than a PMI value
 * may hold), commits, fences WITHOUT collecting data, and reads every
 * peer's key: a peer on another node is served by a direct modex from
 * that node's server. Then a second round: a second key put, committed
 * and fenced the same way, and read again, so data committed after a
 * first direct modex is fetched afresh. Each value is checked.
 *
 * pmix_dmodex [MODE VICTIM]: rank VICTIM puts nothing, and
 *   finalized  it finalizes and exits 0 after the fence; every other rank's
 *              get of its key must fail, not hang: the rank prints
 *              "rank R: get of rank V failed: ERR" and goes on (exit 0);
 *   killed     it raises SIGKILL 1 s after the fence; the others wait in
 *              their get (PMIX_TIMEOUT 30 s) and exit 1 if it fails;
 *   timeout    it sleeps 5 s after the fence, then finalizes; the others
 *              get its key with PMIX_TIMEOUT 1 s and print
 *              "rank R: get of rank V: STATUS after S s";
 *   fence-timeout
 *              it never fences: it sleeps 3 s and finalizes; the others
 *              fence with PMIX_TIMEOUT 1 s and print
 *              "rank R: fence: STATUS after S s". With a further argument
 *              "pairs", each rank's fence names only itself and VICTIM
 *              (part of the namespace: a collective the launcher
 *              completes across nodes); with "size", the timeout is a
 *              size_t (PMIX_SIZE), as some clients pass it, not an int;
 *   connect-timeout
 *              the same with PMIx_Connect over the namespace: the others
 *              print "rank R: connect: STATUS after S s" if it returns;
 *   toobig     every rank puts 2 MiB under a key, fences without
 *              data and gets the next rank's key, printing
 *              "rank R: get of rank N: STATUS"; a fence, and all
 *              finalize (VICTIM is not used);
 *   event      every rank registers for an event, VICTIM notifies it
 *              to the namespace after a fence, and each other rank
 *              prints "rank R: event: yes" or, after 2 s without it,
 *              "rank R: event: no"; a fence, and all finalize.
 *
 * Rank 0 prints "pmix_dmodex ok N=<n>" when FASTPMI_BENCH_VERBOSE is set
 * and the default mode passed on it. Errors go to stderr, exit 1. */
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VALLEN 2000

static pmix_proc_t me;

static void value_of(char *buf, const char *key, pmix_rank_t r)
{
    int n = snprintf(buf, VALLEN + 1, "%s-of-rank-%u-", key, r);
    for (int i = n; i < VALLEN; i++)
        buf[i] = 'a' + (char)((i * 7 + r) % 26);
    buf[VALLEN] = '\0';
}

static void die(const char *what, pmix_status_t rc)
{
    fprintf(stderr, "pmix_dmodex: rank %u: %s: %s\n", me.rank, what, PMIx_Error_string(rc));
    exit(1);
}

static void put(const char *key)
{
    static char v[VALLEN + 1];
    pmix_value_t val;
    pmix_status_t rc;
    value_of(v, key, me.rank);
    val.type = PMIX_STRING;
    val.data.string = v;
    if ((rc = PMIx_Put(PMIX_GLOBAL, key, &val)) != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS)
        die("put/commit", rc);
}

/* fence without data: nobody's key travels with it */
static void fence(void)
{
    pmix_proc_t all;
    pmix_info_t info;
    bool collect = false;
    pmix_status_t rc;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&all, 1, &info, 1)) != PMIX_SUCCESS)
        die("fence", rc);
}

static pmix_status_t get(pmix_rank_t r, const char *key, int timeout, pmix_value_t **got)
{
    pmix_proc_t p;
    pmix_info_t info;
    PMIX_LOAD_PROCID(&p, me.nspace, r);
    if (timeout <= 0)
        return PMIx_Get(&p, key, NULL, 0, got);
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &timeout, PMIX_INT);
    return PMIx_Get(&p, key, &info, 1, got);
}

static void check_all(uint32_t size, const char *key)
{
    char want[VALLEN + 1];
    pmix_value_t *got = NULL;
    pmix_status_t rc;
    for (uint32_t i = 1; i <= size; i++) {
        pmix_rank_t r = (me.rank + i) % size; /* the next ranks first: most are remote */
        if ((rc = get(r, key, 0, &got)) != PMIX_SUCCESS) {
            fprintf(stderr, "pmix_dmodex: rank %u: get %s of rank %u: %s\n", me.rank, key, r, PMIx_Error_string(rc));
            exit(1);
        }
        value_of(want, key, r);
        if (got->type != PMIX_STRING || strcmp(got->data.string, want) != 0) {
            fprintf(stderr, "pmix_dmodex: rank %u: rank %u's %s is wrong\n", me.rank, r, key);
            exit(1);
        }
        PMIX_VALUE_RELEASE(got);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile int got_event;

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                     pmix_info_t results[], size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id, (void)status, (void)source, (void)info, (void)ninfo, (void)results, (void)nresults;
    got_event = 1;
    if (cbfunc != NULL)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

/* has_arg reports whether an argument after the mode and victim is opt */
static int has_arg(int argc, char **argv, const char *opt)
{
    for (int i = 3; i < argc; i++)
        if (strcmp(argv[i], opt) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    pmix_proc_t wild;
    pmix_value_t *got = NULL;
    pmix_status_t rc;
    const char *mode = argc > 2 ? argv[1] : NULL;
    pmix_rank_t victim = argc > 2 ? (pmix_rank_t)atoi(argv[2]) : 0;

    alarm(60);
    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_dmodex: PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &got)) != PMIX_SUCCESS)
        die("get job size", rc);
    uint32_t size = got->data.uint32;
    PMIX_VALUE_RELEASE(got);

    if (mode == NULL) {
        put("fastpmi.dmodex.a");
        fence();
        check_all(size, "fastpmi.dmodex.a");
        put("fastpmi.dmodex.b");
        fence();
        check_all(size, "fastpmi.dmodex.b");
        fence(); /* nobody leaves while another may still read its data */
        if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
            die("finalize", rc);
        if (me.rank == 0 && getenv("FASTPMI_BENCH_VERBOSE") != NULL)
            printf("pmix_dmodex ok N=%u\n", size);
        return 0;
    }

    if (strcmp(mode, "toobig") == 0) {
        static char big[1 << 21];
        pmix_value_t val;
        memset(big, 'b', sizeof(big));
        val.type = PMIX_BYTE_OBJECT;
        val.data.bo.bytes = big;
        val.data.bo.size = sizeof(big);
        if ((rc = PMIx_Put(PMIX_GLOBAL, "fastpmi.dmodex.big", &val)) != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS)
            die("put/commit", rc);
        fence();
        pmix_rank_t next = (me.rank + 1) % size;
        rc = get(next, "fastpmi.dmodex.big", 0, &got);
        printf("rank %u: get of rank %u: %s\n", me.rank, next, PMIx_Error_string(rc));
        fflush(stdout);
        fence();
        if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
            die("finalize", rc);
        return 0;
    }
    if (strcmp(mode, "event") == 0) {
        pmix_status_t code = PMIX_EXTERNAL_ERR_BASE - 7;
        PMIx_Register_event_handler(&code, 1, NULL, 0, on_event, NULL, NULL);
        fence();
        if (me.rank == victim) {
            if ((rc = PMIx_Notify_event(code, &me, PMIX_RANGE_NAMESPACE, NULL, 0, NULL, NULL)) != PMIX_SUCCESS)
                die("notify", rc);
        } else {
            for (int i = 0; i < 200 && !got_event; i++)
                usleep(10000);
            printf("rank %u: event: %s\n", me.rank, got_event ? "yes" : "no");
            fflush(stdout);
        }
        fence();
        if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
            die("finalize", rc);
        return 0;
    }
    if (strcmp(mode, "fence-timeout") == 0 || strcmp(mode, "connect-timeout") == 0) {
        if (me.rank == victim) {
            sleep(3);
        } else {
            pmix_info_t info;
            int timeout = 1;
            size_t timeout_size = 1;
            double t0 = now();
            if (has_arg(argc, argv, "size"))
                PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &timeout_size, PMIX_SIZE);
            else
                PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &timeout, PMIX_INT);
            if (strcmp(mode, "connect-timeout") == 0) {
                rc = PMIx_Connect(&wild, 1, &info, 1);
                printf("rank %u: connect: %s after %.0f s\n", me.rank, PMIx_Error_string(rc), now() - t0);
                fflush(stdout);
                goto done;
            }
            if (has_arg(argc, argv, "pairs")) {
                pmix_proc_t pair[2];
                PMIX_LOAD_PROCID(&pair[0], me.nspace, me.rank);
                PMIX_LOAD_PROCID(&pair[1], me.nspace, victim);
                rc = PMIx_Fence(pair, 2, &info, 1);
            } else {
                rc = PMIx_Fence(&wild, 1, &info, 1);
            }
            printf("rank %u: fence: %s after %.0f s\n", me.rank, PMIx_Error_string(rc), now() - t0);
            fflush(stdout);
        }
    done:
        if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
            die("finalize", rc);
        return 0;
    }
    if (me.rank != victim)
        put("fastpmi.dmodex.a");
    fence();
    if (me.rank == victim) {
        if (strcmp(mode, "killed") == 0) {
            sleep(1);
            raise(SIGKILL);
        }
        if (strcmp(mode, "timeout") == 0)
            sleep(5);
        if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
            die("finalize", rc);
        return 0;
    }
    double t0 = now();
    int timeout = strcmp(mode, "killed") == 0 ? 30 : strcmp(mode, "timeout") == 0 ? 1 : 0;
    rc = get(victim, "fastpmi.dmodex.a", timeout, &got);
    if (rc == PMIX_SUCCESS) {
        fprintf(stderr, "pmix_dmodex: rank %u: got rank %u's key, which it never put\n", me.rank, victim);
        return 1;
    }
    if (strcmp(mode, "killed") == 0)
        die("get of the victim's key", rc);
    if (strcmp(mode, "timeout") == 0)
        printf("rank %u: get of rank %u: %s after %.0f s\n", me.rank, victim, PMIx_Error_string(rc), now() - t0);
    else
        printf("rank %u: get of rank %u failed: %s\n", me.rank, victim, PMIx_Error_string(rc));
    fflush(stdout);
    if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS)
        die("finalize", rc);
    return 0;
}
