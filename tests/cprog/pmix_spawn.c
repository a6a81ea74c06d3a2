/* pmix_spawn: a PMIx client that finds out whether it was spawned, and
 * by whom, the way OpenPMIx's examples and PRRTE's users do: PMIx_Get of
 * its own rank's PMIX_PARENT_ID. Linked against OpenPMIx's client library.
 *
 *   pmix_spawn N
 *
 * Started by the launcher (no parent), the job's last rank spawns N
 * copies of this program with the arguments "child NSPACE RANK" (its own
 * namespace and rank) and prints
 *
 *   rank RANK spawned N children
 *
 * A child checks that its PMIX_PARENT_ID names NSPACE and RANK and that
 * PMIX_SPAWNED is true, and prints
 *
 *   child R of N: parent rank RANK
 *
 * Anything else prints "FAIL ..." and exits 3; a child that finds no
 * parent does not spawn (under a launcher without PMIX_PARENT_ID, such
 * programs spawn for ever). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, pmix_status_t rc)
{
    fprintf(stderr, "FAIL %s: %s\n", what, PMIx_Error_string(rc));
    return 3;
}

static uint32_t job_size(const pmix_proc_t *me)
{
    pmix_proc_t wild;
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&wild, me->nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v) != PMIX_SUCCESS)
        return 0;
    uint32_t n = v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    return n;
}

static int child(const pmix_proc_t *me, const char *nspace, const char *rank)
{
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(me, PMIX_PARENT_ID, NULL, 0, &v);
    if (rc != PMIX_SUCCESS)
        return fail("child: PMIx_Get(PMIX_PARENT_ID)", rc);
    if (v->type != PMIX_PROC || strcmp(v->data.proc->nspace, nspace) != 0 ||
        v->data.proc->rank != (pmix_rank_t)strtoul(rank, NULL, 10)) {
        fprintf(stderr, "FAIL child: PMIX_PARENT_ID is not %s rank %s\n", nspace, rank);
        return 3;
    }
    PMIX_VALUE_RELEASE(v);
    if ((rc = PMIx_Get(me, PMIX_SPAWNED, NULL, 0, &v)) != PMIX_SUCCESS)
        return fail("child: PMIx_Get(PMIX_SPAWNED)", rc);
    if (v->type != PMIX_BOOL || !v->data.flag) {
        fprintf(stderr, "FAIL child: PMIX_SPAWNED is not true\n");
        return 3;
    }
    PMIX_VALUE_RELEASE(v);
    printf("child %u of %u: parent rank %s\n", me->rank, job_size(me), rank);
    return 0;
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_status_t rc;
    int code = 0;
    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Init", rc);
    if (argc == 4 && strcmp(argv[1], "child") == 0) {
        code = child(&me, argv[2], argv[3]);
    } else if (argc != 2 || atoi(argv[1]) < 1) {
        fprintf(stderr, "FAIL usage: pmix_spawn N\n");
        code = 3;
    } else {
        pmix_value_t *v = NULL;
        if (PMIx_Get(&me, PMIX_PARENT_ID, NULL, 0, &v) == PMIX_SUCCESS) {
            fprintf(stderr, "FAIL the launcher's job has a parent\n");
            PMIX_VALUE_RELEASE(v);
            code = 3;
        } else if (me.rank == job_size(&me) - 1) {
            char rank[16];
            snprintf(rank, sizeof(rank), "%u", me.rank);
            pmix_app_t app;
            PMIX_APP_CONSTRUCT(&app);
            app.cmd = strdup(argv[0]);
            char *args[] = {argv[0], "child", me.nspace, rank, NULL};
            app.argv = args;
            app.maxprocs = atoi(argv[1]);
            char nspace[PMIX_MAX_NSLEN + 1];
            rc = PMIx_Spawn(NULL, 0, &app, 1, nspace);
            app.argv = NULL; // not ours to free
            PMIX_APP_DESTRUCT(&app);
            if (rc != PMIX_SUCCESS)
                code = fail("PMIx_Spawn", rc);
            else
                printf("rank %u spawned %d children\n", me.rank, atoi(argv[1]));
        }
    }
    fflush(stdout);
    if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS && code == 0)
        code = fail("PMIx_Finalize", rc);
    return code;
}
