/* pmi2_spawnbench: spawn latency and spawn rate through Slurm's libpmi2,
 * the research's two spawn benchmarks. Rank 0 of the parent job spawns;
 * the other parent ranks only initialize and finalize.
 *
 *   pmi2_spawnbench latency SIZE COUNT
 *     COUNT spawns of SIZE children each, one after the other; a child
 *     initializes PMI, finalizes and exits. Prints one line per spawn:
 *     "spawn_us SIZE <microseconds the PMI2_Job_Spawn call took>".
 *
 *   pmi2_spawnbench rate SECONDS
 *     spawns one-process children back to back for SECONDS; every child
 *     initializes PMI and sleeps until the run's end (as the research's
 *     children did), then finalizes. Prints "spawn_rate <spawns> <seconds>",
 *     and " refused" after it if the launcher refused a spawn before the
 *     time was up (no room for more live jobs: descriptors, universe
 *     size): the rate is then that of the spawns before it. A refusal of
 *     the first spawn is an error.
 *
 *   pmi2_spawnbench noop
 *     every rank initializes PMI and finalizes: a job launch to compare a
 *     spawn of the same size with.
 *
 * A child is the same program started as "pmi2_spawnbench child UNTIL",
 * UNTIL being the CLOCK_REALTIME second it sleeps until (0: none). Errors
 * go to stderr with exit code 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <slurm/pmi2.h>

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int spawn(const char *self, int size, long until)
{
    char untils[32], jobid[256];
    const char *cmds[1] = {self};
    const char *args[2] = {"child", untils};
    const char **argvs[1] = {args};
    int argcs[1] = {2}, maxprocs[1] = {size}, ninfo[1] = {0};
    const MPID_Info *infos[1] = {NULL};
    int errors[1024];

    snprintf(untils, sizeof untils, "%ld", until);
    return PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, ninfo, infos, 0, NULL, jobid, sizeof jobid, errors);
}

int main(int argc, char **argv)
{
    int spawned, size, rank, appnum;

    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_spawnbench: PMI2_Init failed\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (spawned) {
        long until = argc > 2 ? atol(argv[2]) : 0;
        while (until > 0 && time(NULL) < until)
            sleep(1);
    } else if (rank == 0 && argc == 4 && strcmp(argv[1], "latency") == 0) {
        int n = atoi(argv[2]), count = atoi(argv[3]);
        if (n < 1 || n > 1024 || count < 1) {
            fprintf(stderr, "pmi2_spawnbench: latency SIZE COUNT: SIZE 1..1024, COUNT >= 1\n");
            return 1;
        }
        for (int i = 0; i < count; i++) {
            double t0 = now();
            if (spawn(argv[0], n, 0) != PMI2_SUCCESS) {
                fprintf(stderr, "pmi2_spawnbench: spawn %d of %d processes failed\n", i, n);
                return 1;
            }
            printf("spawn_us %d %.0f\n", n, (now() - t0) * 1e6);
        }
    } else if (rank == 0 && argc == 3 && strcmp(argv[1], "rate") == 0) {
        double secs = atof(argv[2]), t0 = now(), t;
        long until = (long)time(NULL) + (long)secs + 2;
        int spawns = 0, refused = 0;
        while ((t = now() - t0) < secs) {
            if (spawn(argv[0], 1, until) != PMI2_SUCCESS) {
                fprintf(stderr, "pmi2_spawnbench: spawn %d failed\n", spawns);
                if (spawns == 0)
                    return 1;
                refused = 1;
                t = now() - t0;
                break;
            }
            spawns++;
        }
        printf("spawn_rate %d %.3f%s\n", spawns, t, refused ? " refused" : "");
    } else if (argc == 2 && strcmp(argv[1], "noop") == 0) {
        /* nothing between init and finalize */
    } else if (rank == 0) {
        fprintf(stderr, "usage: pmi2_spawnbench latency SIZE COUNT | rate SECONDS | noop\n");
        return 1;
    }
    if (PMI2_Finalize() != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_spawnbench: PMI2_Finalize failed\n");
        return 1;
    }
    return 0;
}
