/* pmi2_cost: what PMI costs one rank, through whichever libpmi2.so.0 is
 * loaded (built against Slurm's; run with LD_LIBRARY_PATH=build/lib for
 * libfastpmi). Each rank prints one line:
 *
 *   cost rank=R start_cpu_us=.. init_cpu_us=.. init_us=.. xchg_cpu_us=.. xchg_us=.. get_ns=.. [ag_us=.. iag_us=..]
 *
 * start_cpu_us: CPU the process used before PMI2_Init (exec, the dynamic
 * loader and the library's load); init_cpu_us/init_us: PMI2_Init's CPU and
 * wall time; xchg_*: the pmi2 workload's exchange (put, fence, get of
 * every rank's key, ring); get_ns: one more get of a key already on the
 * node, averaged over 10,000; ag_us/iag_us: PMIX_Allgather and
 * PMIX_Iallgather+PMIX_Wait of a business-card-sized value, when the
 * library has them (found with dlsym). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slurm/pmi2.h>

static double clk(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void check(int rc, const char *what)
{
    if (rc != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_cost: %s failed: rc=%d\n", what, rc);
        exit(1);
    }
}

int main(void)
{
    int spawned, size, rank, appnum, len, rr, rn;
    char key[PMI2_MAX_KEYLEN], val[PMI2_MAX_VALLEN + 1], l[PMI2_MAX_VALLEN + 1], r[PMI2_MAX_VALLEN + 1];

    double c0 = clk(CLOCK_PROCESS_CPUTIME_ID), w0 = clk(CLOCK_MONOTONIC);
    check(PMI2_Init(&spawned, &size, &rank, &appnum), "PMI2_Init");
    double c1 = clk(CLOCK_PROCESS_CPUTIME_ID), w1 = clk(CLOCK_MONOTONIC);

    snprintf(key, sizeof key, "bc-%d", rank);
    snprintf(val, sizeof val, "description#node$port#%d$ifname#10.0.0.%d$", 40000 + rank, rank % 250);
    check(PMI2_KVS_Put(key, val), "PMI2_KVS_Put");
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence");
    for (int i = 0; i < size; i++) {
        snprintf(key, sizeof key, "bc-%d", i);
        check(PMI2_KVS_Get(NULL, i, key, val, sizeof val, &len), "PMI2_KVS_Get");
    }
    snprintf(val, sizeof val, "ring-%d", rank);
    check(PMIX_Ring(val, &rr, &rn, l, r, PMI2_MAX_VALLEN), "PMIX_Ring");
    double c2 = clk(CLOCK_PROCESS_CPUTIME_ID), w2 = clk(CLOCK_MONOTONIC);

    const int gets = 10000;
    snprintf(key, sizeof key, "bc-%d", (rank + 1) % size);
    for (int i = 0; i < gets; i++)
        check(PMI2_KVS_Get(NULL, (rank + 1) % size, key, val, sizeof val, &len), "PMI2_KVS_Get");
    double w3 = clk(CLOCK_MONOTONIC);

    printf("cost rank=%d start_cpu_us=%.0f init_cpu_us=%.1f init_us=%.1f xchg_cpu_us=%.0f xchg_us=%.0f get_ns=%.0f", rank,
           c0, c1 - c0, w1 - w0, c2 - c1, w2 - w1, (w3 - w2) * 1e3 / gets);

    int (*ag)(const char *, void *) = (int (*)(const char *, void *))dlsym(RTLD_DEFAULT, "PMIX_Allgather");
    int (*iag)(const char *, void *, void **) = (int (*)(const char *, void *, void **))dlsym(RTLD_DEFAULT, "PMIX_Iallgather");
    int (*wait)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "PMIX_Wait");
    if (ag != NULL && iag != NULL && wait != NULL) {
        char *buf = malloc((size_t)size * 1024);
        void *req;
        snprintf(val, sizeof val, "description#node$port#%d$ifname#10.0.0.%d$", 40000 + rank, rank % 250);
        double a0 = clk(CLOCK_MONOTONIC);
        check(ag(val, buf), "PMIX_Allgather");
        double a1 = clk(CLOCK_MONOTONIC);
        check(iag(val, buf, &req), "PMIX_Iallgather");
        check(wait(req), "PMIX_Wait");
        double a2 = clk(CLOCK_MONOTONIC);
        printf(" ag_us=%.0f iag_us=%.0f", a1 - a0, a2 - a1);
        free(buf);
    }
    printf("\n");
    check(PMI2_Finalize(), "PMI2_Finalize");
    return 0;
}
