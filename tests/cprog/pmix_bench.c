/* pmix_bench: a PMIx-bound workload for the launchers' comparison and the
 * PMIx tests: PMIx_Init, PMIx_Put of one key (PMIX_GLOBAL), PMIx_Commit,
 * PMIx_Fence with PMIX_COLLECT_DATA over the whole namespace, PMIx_Get of
 * every peer's key (each value checked), PMIx_Finalize. Linked against
 * OpenPMIx's client library (libpmix).
 *
 * Silent on success unless FASTPMI_BENCH_VERBOSE is set, then rank 0 prints
 * "pmix_bench ok N=<n>". A wrong or missing value is reported on stderr
 * and the rank exits 1. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY "fastpmi.bench"

static void value_of(char *buf, size_t len, const char *nspace, pmix_rank_t r)
{
    snprintf(buf, len, "business-card-of-%s-rank-%u-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", nspace, r);
}

int main(void)
{
    pmix_proc_t me, peer;
    pmix_value_t val, *got = NULL;
    pmix_info_t info;
    char want[512];
    bool collect = true;
    int rc;

    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_bench: PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    /* The job size. */
    PMIX_LOAD_PROCID(&peer, me.nspace, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Get(&peer, PMIX_JOB_SIZE, NULL, 0, &got)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_bench: rank %u: get job size: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    uint32_t size = got->data.uint32;
    PMIX_VALUE_RELEASE(got);

    value_of(want, sizeof(want), me.nspace, me.rank);
    val.type = PMIX_STRING;
    val.data.string = want;
    if ((rc = PMIx_Put(PMIX_GLOBAL, KEY, &val)) != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_bench: rank %u: put/commit: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&peer, 1, &info, 1)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_bench: rank %u: fence: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    for (uint32_t r = 0; r < size; r++) {
        PMIX_LOAD_PROCID(&peer, me.nspace, r);
        if ((rc = PMIx_Get(&peer, KEY, NULL, 0, &got)) != PMIX_SUCCESS) {
            fprintf(stderr, "pmix_bench: rank %u: get rank %u's key: %s\n", me.rank, r, PMIx_Error_string(rc));
            return 1;
        }
        value_of(want, sizeof(want), me.nspace, r);
        if (got->type != PMIX_STRING || strcmp(got->data.string, want) != 0) {
            fprintf(stderr, "pmix_bench: rank %u: rank %u's value is wrong\n", me.rank, r);
            return 1;
        }
        PMIX_VALUE_RELEASE(got);
    }
    if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_bench: rank %u: finalize: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    if (me.rank == 0 && getenv("FASTPMI_BENCH_VERBOSE") != NULL)
        printf("pmix_bench ok N=%u\n", size);
    return 0;
}
