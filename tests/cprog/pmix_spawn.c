/* pmix_spawn: a PMIx client that finds out whether it was spawned, and
 * by whom, the way OpenPMIx's examples and PRRTE's users do: PMIx_Get of
 * its own rank's PMIX_PARENT_ID; then, with "connect", parent and
 * children join. Linked against OpenPMIx's client library.
 *
 *   pmix_spawn N [connect]
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
 * With "connect", the spawning rank hands the children's namespace to
 * its job (a put and a fence), and every rank of both jobs then calls
 * PMIx_Connect over both namespaces, puts a card and the name of its node
 * (its PMIX_HOSTNAME), fences over both namespaces collecting data,
 * checks the other job's PMIX_JOB_SIZE, reads the card of every rank of
 * the other job, checks that every rank of both jobs has the
 * PMIX_HOSTNAME that rank itself was given (nodes named alike on every
 * node, and the other job's ranks placed on a node without them), prints
 *
 *   connect: parent|child rank R read K cards
 *
 * and calls PMIx_Disconnect.
 *
 * Anything else prints "FAIL ..." and exits 3; a child that finds no
 * parent does not spawn (under a launcher without PMIX_PARENT_ID, such
 * programs spawn for ever). */
#include "pmix_check.h"

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

// join connects to the other job (namespace other, size n), fences over
// both jobs with every rank's card and node name, and reads the other
// job's cards and both jobs' node names.
static int join(const pmix_proc_t *me, const char *role, const char *other, uint32_t n)
{
    pmix_proc_t procs[2];
    PMIX_LOAD_PROCID(&procs[0], me->nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&procs[1], other, PMIX_RANK_WILDCARD);
    pmix_status_t rc;
    if ((rc = PMIx_Connect(procs, 2, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Connect", rc);
    int code = put_card(me);
    if (code != 0)
        return code;
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(procs, 2, &info, 1)) != PMIX_SUCCESS)
        return fail("PMIx_Fence over both jobs", rc);
    // The other job's size, as a client asks for it (on a node without
    // ranks of that job too).
    pmix_proc_t whole;
    pmix_value_t *sz = NULL;
    PMIX_LOAD_PROCID(&whole, other, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Get(&whole, PMIX_JOB_SIZE, NULL, 0, &sz)) != PMIX_SUCCESS)
        return fail("get the other job's size", rc);
    if (sz->type != PMIX_UINT32 || sz->data.uint32 != n) {
        fprintf(stderr, "FAIL the other job's size: type %d, %u, want %u\n", sz->type, sz->data.uint32, n);
        return 3;
    }
    PMIX_VALUE_RELEASE(sz);
    uint32_t read = 0, mine = 0;
    if ((code = read_cards(other, n, &read)) != 0 || (code = read_cards(me->nspace, job_size(me), &mine)) != 0)
        return code;
    printf("connect: %s rank %u read %u cards\n", role, me->rank, read);
    if ((rc = PMIx_Disconnect(procs, 2, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Disconnect", rc);
    return 0;
}

static int child(const pmix_proc_t *me, const char *nspace, const char *rank, uint32_t parents)
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
    return parents > 0 ? join(me, "child", nspace, parents) : 0;
}

// parent_join tells the parent job the children's namespace (the
// spawning rank, the last, puts it) and joins the children.
static int parent_join(const pmix_proc_t *me, uint32_t size, char *nspace, uint32_t children)
{
    pmix_status_t rc;
    pmix_value_t val, *v = NULL;
    if (me->rank == size - 1) {
        val.type = PMIX_STRING;
        val.data.string = nspace;
        if ((rc = PMIx_Put(PMIX_GLOBAL, "fastpmi.children", &val)) != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS)
            return fail("put the children's namespace", rc);
    }
    pmix_proc_t all, spawner;
    PMIX_LOAD_PROCID(&all, me->nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&all, 1, &info, 1)) != PMIX_SUCCESS)
        return fail("parent fence", rc);
    PMIX_LOAD_PROCID(&spawner, me->nspace, size - 1);
    if ((rc = PMIx_Get(&spawner, "fastpmi.children", NULL, 0, &v)) != PMIX_SUCCESS || v->type != PMIX_STRING)
        return fail("get the children's namespace", rc);
    snprintf(nspace, PMIX_MAX_NSLEN + 1, "%s", v->data.string);
    PMIX_VALUE_RELEASE(v);
    return join(me, "parent", nspace, children);
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_status_t rc;
    int code = 0;
    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Init", rc);
    int connect = argc == 3 && strcmp(argv[2], "connect") == 0;
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "child") == 0) {
        code = child(&me, argv[2], argv[3], argc == 5 ? (uint32_t)atoi(argv[4]) : 0);
    } else if ((argc != 2 && !connect) || atoi(argv[1]) < 1) {
        fprintf(stderr, "FAIL usage: pmix_spawn N [connect]\n");
        code = 3;
    } else {
        pmix_value_t *v = NULL;
        if (PMIx_Get(&me, PMIX_PARENT_ID, NULL, 0, &v) == PMIX_SUCCESS) {
            fprintf(stderr, "FAIL the launcher's job has a parent\n");
            PMIX_VALUE_RELEASE(v);
            code = 3;
        } else {
            uint32_t size = job_size(&me);
            char nspace[PMIX_MAX_NSLEN + 1] = "";
            if (me.rank == size - 1) {
                char rank[16], parents[16];
                snprintf(rank, sizeof(rank), "%u", me.rank);
                snprintf(parents, sizeof(parents), "%u", size);
                pmix_app_t app;
                PMIX_APP_CONSTRUCT(&app);
                app.cmd = strdup(argv[0]);
                char *args[] = {argv[0], "child", me.nspace, rank, connect ? parents : NULL, NULL};
                app.argv = args;
                app.maxprocs = atoi(argv[1]);
                rc = PMIx_Spawn(NULL, 0, &app, 1, nspace);
                app.argv = NULL; // not ours to free
                PMIX_APP_DESTRUCT(&app);
                if (rc != PMIX_SUCCESS)
                    code = fail("PMIx_Spawn", rc);
                else
                    printf("rank %u spawned %d children\n", me.rank, atoi(argv[1]));
            }
            if (connect && code == 0)
                code = parent_join(&me, size, nspace, (uint32_t)atoi(argv[1]));
        }
    }
    fflush(stdout);
    if ((rc = PMIx_Finalize(NULL, 0)) != PMIX_SUCCESS && code == 0)
        code = fail("PMIx_Finalize", rc);
    return code;
}
