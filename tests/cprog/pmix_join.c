/* pmix_join: two separately launched PMIx jobs that find each other by
 * name and try to connect, as MPI_Comm_accept/MPI_Comm_connect servers
 * and clients do. Linked against OpenPMIx's client library.
 *
 *   pmix_join publish NAME | lookup NAME | lookup-die NAME
 *
 * Rank 0 publishes the job's namespace under NAME, or looks it up
 * (waiting up to 60 s for it), and hands it to its job (a put and a
 * fence); every rank then calls PMIx_Connect over both namespaces and
 * prints
 *
 *   join: rank R: connected          or
 *   join: rank R: refused: STATUS
 *
 * Once connected, every rank puts a card and its node's name, fences over
 * both jobs without collecting data, checks the other job's
 * PMIX_JOB_SIZE, reads the card of every rank of the other job (each a
 * direct modex: the card is fetched from the rank's node) and checks its
 * PMIX_HOSTNAME against the one that rank was given, prints
 *
 *   join: rank R: read K cards
 *
 * and disconnects; then it finalizes. With lookup-die, the job's rank 1
 * exits with code 5 instead of connecting: the other job's connect must
 * fail, not wait. Other failures print "FAIL ..."
 * and exit 3. */
#include "pmix_check.h"

static int find_other(const pmix_proc_t *me, int publish, const char *name, char *other)
{
    pmix_status_t rc;
    if (publish) {
        pmix_info_t info;
        PMIX_INFO_LOAD(&info, name, me->nspace, PMIX_STRING);
        rc = PMIx_Publish(&info, 1);
        PMIX_INFO_DESTRUCT(&info);
        if (rc != PMIX_SUCCESS)
            return fail("PMIx_Publish", rc);
        return 0;
    }
    pmix_pdata_t pd;
    PMIX_PDATA_CONSTRUCT(&pd);
    PMIX_LOAD_KEY(pd.key, name);
    pmix_info_t info[2];
    bool wait = true;
    int timeout = 60;
    PMIX_INFO_LOAD(&info[0], PMIX_WAIT, &wait, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &timeout, PMIX_INT);
    rc = PMIx_Lookup(&pd, 1, info, 2);
    if (rc != PMIX_SUCCESS || pd.value.type != PMIX_STRING)
        return fail("PMIx_Lookup", rc);
    snprintf(other, PMIX_MAX_NSLEN + 1, "%s", pd.value.data.string);
    PMIX_PDATA_DESTRUCT(&pd);
    return 0;
}

// exchange puts this rank's card, fences over both jobs (procs) without
// collecting data, checks the size of the other job (namespace other)
// and reads its every card.
static int exchange(const pmix_proc_t *me, const pmix_proc_t *procs, const char *other)
{
    int code = put_card(me);
    if (code != 0)
        return code;
    // A card committed before the fence is there for every direct modex
    // after it (one before it may find the rank's earlier commit: rank 0
    // committed the other namespace).
    pmix_status_t rc;
    if ((rc = PMIx_Fence(procs, 2, NULL, 0)) != PMIX_SUCCESS)
        return fail("fence over both jobs", rc);
    pmix_proc_t whole;
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&whole, other, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Get(&whole, PMIX_JOB_SIZE, NULL, 0, &v)) != PMIX_SUCCESS || v->type != PMIX_UINT32)
        return fail("get the other job's size", rc);
    uint32_t n = v->data.uint32, read = 0;
    PMIX_VALUE_RELEASE(v);
    if ((code = read_cards(other, n, &read)) != 0)
        return code;
    printf("join: rank %u: read %u cards\n", me->rank, read);
    return 0;
}

int main(int argc, char **argv)
{
    pmix_proc_t me;
    pmix_status_t rc;
    int die = argc == 3 && strcmp(argv[1], "lookup-die") == 0;
    if (argc != 3 || (strcmp(argv[1], "publish") != 0 && strcmp(argv[1], "lookup") != 0 && !die)) {
        fprintf(stderr, "FAIL usage: pmix_join publish|lookup|lookup-die NAME\n");
        return 3;
    }
    int publish = strcmp(argv[1], "publish") == 0;
    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Init", rc);
    char other[PMIX_MAX_NSLEN + 1] = "";
    pmix_value_t val, *v = NULL;
    if (me.rank == 0) {
        // The publisher learns the other namespace from the other side,
        // which publishes its own under NAME.back once it found NAME.
        char back[256];
        snprintf(back, sizeof(back), "%s.back", argv[2]);
        int code = publish ? find_other(&me, 1, argv[2], NULL) : find_other(&me, 0, argv[2], other);
        if (code == 0)
            code = publish ? find_other(&me, 0, back, other) : find_other(&me, 1, back, NULL);
        if (code != 0)
            return code;
        val.type = PMIX_STRING;
        val.data.string = other;
        if ((rc = PMIx_Put(PMIX_GLOBAL, "fastpmi.other", &val)) != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS)
            return fail("put the other namespace", rc);
    }
    pmix_proc_t all, root;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&all, 1, &info, 1)) != PMIX_SUCCESS)
        return fail("fence", rc);
    PMIX_LOAD_PROCID(&root, me.nspace, 0);
    if ((rc = PMIx_Get(&root, "fastpmi.other", NULL, 0, &v)) != PMIX_SUCCESS || v->type != PMIX_STRING)
        return fail("get the other namespace", rc);
    snprintf(other, sizeof(other), "%s", v->data.string);
    PMIX_VALUE_RELEASE(v);
    pmix_proc_t procs[2];
    PMIX_LOAD_PROCID(&procs[0], me.nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&procs[1], other, PMIX_RANK_WILDCARD);
    if (die && me.rank == 1)
        exit(5);
    rc = PMIx_Connect(procs, 2, NULL, 0);
    int code = 0;
    if (rc == PMIX_SUCCESS) {
        printf("join: rank %u: connected\n", me.rank);
        code = exchange(&me, procs, other);
        if ((rc = PMIx_Disconnect(procs, 2, NULL, 0)) != PMIX_SUCCESS && code == 0)
            code = fail("PMIx_Disconnect", rc);
    } else {
        printf("join: rank %u: refused: %s\n", me.rank, PMIx_Error_string(rc));
    }
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return code;
}
