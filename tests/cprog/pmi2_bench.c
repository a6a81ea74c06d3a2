/* pmi2_bench: the PMI-bound start-up workload, through Slurm's libpmi2:
 * PMI2_Init, put one key, fence, get every rank's key, PMIX_Ring (skipped
 * with the argument "noring", for launchers without it), PMI2_Finalize.
 * Silent; a failure goes to stderr and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/pmi2.h>

static void check(int rc, const char *what, int rank)
{
    if (rc != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_bench: rank %d: %s failed: rc=%d\n", rank, what, rc);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int spawned, size, rank = -1, appnum, len;
    char key[PMI2_MAX_KEYLEN], val[PMI2_MAX_VALLEN + 1], want[PMI2_MAX_VALLEN + 1];
    char left[PMI2_MAX_VALLEN + 1], right[PMI2_MAX_VALLEN + 1];
    int ringrank, ringsize;

    check(PMI2_Init(&spawned, &size, &rank, &appnum), "PMI2_Init", rank);
    /* A value shaped like an MPICH business card. */
    snprintf(key, sizeof key, "bc-%d", rank);
    snprintf(val, sizeof val, "description#node$port#%d$ifname#10.0.0.%d$", 40000 + rank, rank % 250);
    check(PMI2_KVS_Put(key, val), "PMI2_KVS_Put", rank);
    check(PMI2_KVS_Fence(), "PMI2_KVS_Fence", rank);
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "bc-%d", r);
        snprintf(want, sizeof want, "description#node$port#%d$ifname#10.0.0.%d$", 40000 + r, r % 250);
        check(PMI2_KVS_Get(NULL, r, key, val, sizeof val, &len), "PMI2_KVS_Get", rank);
        if (strcmp(val, want) != 0) {
            fprintf(stderr, "pmi2_bench: rank %d: %s is \"%s\", want \"%s\"\n", rank, key, val, want);
            return 1;
        }
    }
    if (argc > 1 && strcmp(argv[1], "noring") == 0) {
        check(PMI2_Finalize(), "PMI2_Finalize", rank);
        return 0;
    }
    snprintf(val, sizeof val, "ring-%d", rank);
    check(PMIX_Ring(val, &ringrank, &ringsize, left, right, PMI2_MAX_VALLEN), "PMIX_Ring", rank);
    if (ringsize != size || ringrank < 0 || ringrank >= size) {
        fprintf(stderr, "pmi2_bench: rank %d: ring position %d of %d in a job of %d\n", rank, ringrank, ringsize, size);
        return 1;
    }
    check(PMI2_Finalize(), "PMI2_Finalize", rank);
    return 0;
}
