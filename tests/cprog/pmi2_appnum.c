/* pmi2_appnum: every rank of an MPMD job, through Slurm's libpmi2, puts
 * its appnum under app-<rank>, fences, reads every rank's and prints
 *   "appnum rank R size S appnum A arg X apps a0,a1,..."
 * (the Go test rank spawnprog -appnum prints the same, so the two mix in
 * one job). Errors go to stderr with exit code 1. */
#include <stdio.h>
#include <string.h>

#include <slurm/pmi2.h>

int main(int argc, char **argv)
{
    int spawned, size, rank, appnum, len;
    char jobid[256], key[64], val[64], apps[4096] = "";

    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS || PMI2_Job_GetId(jobid, sizeof jobid) != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_appnum: init failed\n");
        return 1;
    }
    snprintf(key, sizeof key, "app-%d", rank);
    snprintf(val, sizeof val, "%d", appnum);
    if (PMI2_KVS_Put(key, val) != PMI2_SUCCESS || PMI2_KVS_Fence() != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_appnum: put/fence failed\n");
        return 1;
    }
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "app-%d", r);
        if (PMI2_KVS_Get(jobid, r, key, val, sizeof val, &len) != PMI2_SUCCESS) {
            fprintf(stderr, "pmi2_appnum: get %s failed\n", key);
            return 1;
        }
        if (r > 0)
            strncat(apps, ",", sizeof apps - strlen(apps) - 1);
        strncat(apps, val, sizeof apps - strlen(apps) - 1);
    }
    printf("appnum rank %d size %d appnum %d arg %s apps %s\n", rank, size, appnum, argc > 1 ? argv[1] : "-", apps);
    return PMI2_Finalize() == PMI2_SUCCESS ? 0 : 1;
}
