/* pmi2_test: a PMI-2 conformance check through Slurm's libpmi2, run by
 * every rank of a job.
 *
 *  1. PMI2_Init; size and rank equal PMI_SIZE / PMI_RANK; not spawned.
 *  2. PMI2_Job_GetId is non-empty (and equals PMI_JOBID when that is set).
 *  3. KVS: put key-<r> (a value with '=', '/', ':' and ',') and big-<r>
 *     (1000 bytes), fence, get every rank's keys both with the source
 *     rank as hint (and our job id) and with PMI2_ID_NULL (and no job id).
 *  4. Job attributes: PMI_process_mapping parsed (vector form, including
 *     repeats and the legacy cyclic wrap); all ranks on node 0 unless
 *     EXPECT_NNODES says otherwise; with EXPECT_PLACEMENT=block (ranks
 *     filled node by node, ceil(size/nodes) per node) or cyclic (rank r on
 *     node r mod nodes) it must place every rank so; MPI_LOCALNRANKS /
 *     MPI_LOCALRANKID, if set, agree with it. universeSize is found and equals EXPECT_USIZE
 *     when that is set.
 *  5. Node attributes: the first rank of each node puts nodekey, the
 *     others read it with wait; a missing node attribute without wait is
 *     "not found" at once.
 *  6. PMIX_Ring of "ring-<r>": position in [0,N), size N; positions form
 *     a permutation and left/right are the values at position-1 / +1
 *     (wrapping), checked through a second put/fence round.
 *  7. A get of a key nobody put fails instead of hanging.
 *  8. PMI2_Finalize; print "pmi2 ok rank R ...".
 *
 * Any mismatch goes to stderr and exits 1; a call that hangs longer than
 * PMI2_TEST_ALARM seconds (default 60) is reported and exits 3.
 * PMI2_TEST_SKIP lists checks to leave out ("usize", "ring"), for servers
 * that lack them (Hydra 4.0.2 has neither universeSize nor ring). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/pmi2.h>

static int me = -1;
static const char *volatile phase = "start";

static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "pmi2_test: rank %d: %s: ", me, phase);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void on_alarm(int sig)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "pmi2_test: rank %d: hung in %s\n", me, phase);

    (void)sig;
    if (write(2, buf, n) < 0) {
        /* nothing left to do */
    }
    _exit(3);
}

static int skip(const char *what)
{
    const char *s = getenv("PMI2_TEST_SKIP");
    return s != NULL && strstr(s, what) != NULL;
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? atoi(v) : dflt;
}

/* ---- PMI_process_mapping ------------------------------------------- */

struct block {
    int start, nnodes, ppn;
};

struct blocks {
    struct block b[4096];
    int n;
};

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

static const char *parse_uint(const char *p, int *out)
{
    char *end;
    long v;

    p = skip_ws(p);
    if (*p < '0' || *p > '9')
        return NULL;
    v = strtol(p, &end, 10);
    *out = (int)v;
    return skip_ws(end);
}

static const char *parse_items(const char *p, struct blocks *bs, char close);

/* item = "(" start "," nnodes "," ppn ")" / nodeid / "[" items "]x" count */
static const char *parse_item(const char *p, struct blocks *bs)
{
    p = skip_ws(p);
    if (*p == '(') {
        struct block b;
        if ((p = parse_uint(p + 1, &b.start)) == NULL || *p++ != ',')
            return NULL;
        if ((p = parse_uint(p, &b.nnodes)) == NULL || *p++ != ',')
            return NULL;
        if ((p = parse_uint(p, &b.ppn)) == NULL || *p++ != ')')
            return NULL;
        if (bs->n == (int)(sizeof bs->b / sizeof bs->b[0]))
            return NULL;
        bs->b[bs->n++] = b;
        return skip_ws(p);
    }
    if (*p == '[') {
        int first = bs->n, count;
        if ((p = parse_items(p + 1, bs, ']')) == NULL || *p++ != ']' || *p++ != 'x')
            return NULL;
        if ((p = parse_uint(p, &count)) == NULL || count < 1)
            return NULL;
        int len = bs->n - first;
        for (int k = 1; k < count; k++)
            for (int i = 0; i < len; i++) {
                if (bs->n == (int)(sizeof bs->b / sizeof bs->b[0]))
                    return NULL;
                bs->b[bs->n++] = bs->b[first + i];
            }
        return p;
    }
    struct block b = {0, 1, 1};
    if ((p = parse_uint(p, &b.start)) == NULL)
        return NULL;
    if (bs->n == (int)(sizeof bs->b / sizeof bs->b[0]))
        return NULL;
    bs->b[bs->n++] = b;
    return p;
}

static const char *parse_items(const char *p, struct blocks *bs, char close)
{
    for (;;) {
        if ((p = parse_item(p, bs)) == NULL)
            return NULL;
        if (*p == close)
            return p;
        if (*p++ != ',')
            return NULL;
    }
}

/* map_ranks fills node[0..size) from a "(vector,...)" mapping and
 * returns 0, or -1 if the mapping cannot be parsed or places no rank. */
static int map_ranks(const char *s, int size, int *node)
{
    static struct blocks bs;
    const char *p = skip_ws(s);

    bs.n = 0;
    if (*p++ != '(')
        return -1;
    p = skip_ws(p);
    if (strncmp(p, "vector", 6) != 0)
        return -1;
    p = skip_ws(p + 6);
    if (*p++ != ',')
        return -1;
    if ((p = parse_items(p, &bs, ')')) == NULL || *p++ != ')' || *skip_ws(p) != '\0')
        return -1;

    /* Walk the blocks; when they run out, restart at the first block that
     * begins at node 0 (the legacy cyclic form). */
    int restart = -1;
    for (int i = 0; i < bs.n; i++)
        if (bs.b[i].start == 0) {
            restart = i;
            break;
        }
    int r = 0, i = 0, placed = 0;
    while (r < size) {
        if (i == bs.n) {
            if (restart < 0 || placed == 0)
                return -1;
            i = restart;
            placed = 0;
        }
        for (int n = 0; n < bs.b[i].nnodes && r < size; n++)
            for (int k = 0; k < bs.b[i].ppn && r < size; k++) {
                node[r++] = bs.b[i].start + n;
                placed++;
            }
        i++;
    }
    return 0;
}

/* ---- checks ---------------------------------------------------------- */

static void kvs_get(const char *jobid, int src, const char *key, char *val, int max)
{
    int len = -1;
    int rc = PMI2_KVS_Get(jobid, src, key, val, max, &len);

    if (rc != PMI2_SUCCESS)
        die("PMI2_KVS_Get(%s, src %d) failed: rc=%d", key, src, rc);
    if (len < 0 || (int)strlen(val) != len)
        die("PMI2_KVS_Get(%s, src %d): vallen %d for a %zu-byte value", key, src, len, strlen(val));
}

static void want_val(const char *what, const char *got, const char *want)
{
    if (strcmp(got, want) != 0)
        die("%s is \"%s\", want \"%s\"", what, got, want);
}

static void put_value(char *buf, size_t len, int r)
{
    snprintf(buf, len, "val-%d-x/y=z,w:q=%d", r, r * 7);
}

static void big_value(char *buf, int r)
{
    int n = snprintf(buf, 1001, "big-%d-", r);
    for (int i = n; i < 1000; i++)
        buf[i] = 'a' + (r + i) % 26;
    buf[1000] = '\0';
}

int main(void)
{
    int spawned = -1, size = -1, rank = -1, appnum = -9, rc;
    char jobid[PMI2_MAX_VALLEN], key[PMI2_MAX_KEYLEN], val[PMI2_MAX_VALLEN + 1], want[PMI2_MAX_VALLEN + 1];
    int found;

    signal(SIGALRM, on_alarm);
    alarm(env_int("PMI2_TEST_ALARM", 60));

    phase = "PMI2_Init";
    rc = PMI2_Init(&spawned, &size, &rank, &appnum);
    if (rc != PMI2_SUCCESS)
        die("failed: rc=%d", rc);
    me = rank;
    if (size != env_int("PMI_SIZE", -1))
        die("size %d but PMI_SIZE=%s", size, getenv("PMI_SIZE"));
    if (rank != env_int("PMI_RANK", -1))
        die("rank %d but PMI_RANK=%s", rank, getenv("PMI_RANK"));
    if (rank < 0 || rank >= size)
        die("rank %d out of [0,%d)", rank, size);
    if (spawned != 0)
        die("spawned=%d, want 0", spawned);

    phase = "PMI2_Job_GetId";
    memset(jobid, 0, sizeof jobid);
    if ((rc = PMI2_Job_GetId(jobid, sizeof jobid)) != PMI2_SUCCESS)
        die("failed: rc=%d", rc);
    if (jobid[0] == '\0')
        die("empty job id");
    if (getenv("PMI_JOBID") != NULL)
        want_val("job id", jobid, getenv("PMI_JOBID"));

    phase = "KVS put/fence/get";
    snprintf(key, sizeof key, "key-%d", rank);
    put_value(val, sizeof val, rank);
    if ((rc = PMI2_KVS_Put(key, val)) != PMI2_SUCCESS)
        die("PMI2_KVS_Put(%s) failed: rc=%d", key, rc);
    snprintf(key, sizeof key, "big-%d", rank);
    big_value(val, rank);
    if ((rc = PMI2_KVS_Put(key, val)) != PMI2_SUCCESS)
        die("PMI2_KVS_Put(%s) failed: rc=%d", key, rc);
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS)
        die("PMI2_KVS_Fence failed: rc=%d", rc);
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "key-%d", r);
        put_value(want, sizeof want, r);
        kvs_get(jobid, r, key, val, sizeof val);
        want_val(key, val, want);
        kvs_get(NULL, PMI2_ID_NULL, key, val, sizeof val);
        want_val(key, val, want);
        snprintf(key, sizeof key, "big-%d", r);
        big_value(want, r);
        kvs_get(NULL, r, key, val, sizeof val);
        want_val(key, val, want);
    }

    phase = "PMI_process_mapping";
    int *node = calloc(size, sizeof *node);
    found = 0;
    val[0] = '\0';
    rc = PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof val, &found);
    if (rc != PMI2_SUCCESS || !found)
        die("not available: rc=%d found=%d", rc, found);
    if (map_ranks(val, size, node) != 0)
        die("cannot parse \"%s\" for %d ranks", val, size);
    int nnodes_want = env_int("EXPECT_NNODES", 1), maxnode = -1;
    for (int r = 0; r < size; r++)
        if (node[r] > maxnode)
            maxnode = node[r];
    if (maxnode + 1 != nnodes_want)
        die("\"%s\" places %d ranks on %d nodes, want %d", val, size, maxnode + 1, nnodes_want);
    const char *placement = getenv("EXPECT_PLACEMENT");
    if (placement != NULL && *placement != '\0') {
        int cyclic = strcmp(placement, "cyclic") == 0, ppn = (size + nnodes_want - 1) / nnodes_want;
        if (!cyclic && strcmp(placement, "block") != 0)
            die("EXPECT_PLACEMENT=%s: want block or cyclic", placement);
        for (int r = 0; r < size; r++) {
            int want_node = cyclic ? r % nnodes_want : r / ppn;
            if (node[r] != want_node)
                die("\"%s\" puts rank %d on node %d, %s placement on %d nodes wants %d", val, r, node[r], placement,
                    nnodes_want, want_node);
        }
    }
    int nlocal = 0, localid = -1, leader = -1;
    for (int r = 0; r < size; r++)
        if (node[r] == node[rank]) {
            if (r == rank)
                localid = nlocal;
            if (leader < 0)
                leader = r;
            nlocal++;
        }
    if (getenv("MPI_LOCALNRANKS") != NULL && env_int("MPI_LOCALNRANKS", -1) != nlocal)
        die("MPI_LOCALNRANKS=%s but \"%s\" puts %d ranks on my node", getenv("MPI_LOCALNRANKS"), val, nlocal);
    if (getenv("MPI_LOCALRANKID") != NULL && env_int("MPI_LOCALRANKID", -1) != localid)
        die("MPI_LOCALRANKID=%s but I am local rank %d in \"%s\"", getenv("MPI_LOCALRANKID"), localid, val);

    phase = "universeSize";
    int usize = -2;
    found = 0;
    val[0] = '\0';
    rc = PMI2_Info_GetJobAttr("universeSize", val, sizeof val, &found);
    if (!skip("usize")) {
        if (rc != PMI2_SUCCESS || !found)
            die("not available: rc=%d found=%d", rc, found);
        usize = atoi(val);
        if (getenv("EXPECT_USIZE") != NULL && usize != env_int("EXPECT_USIZE", 0))
            die("universeSize \"%s\", want %s", val, getenv("EXPECT_USIZE"));
    }

    phase = "node attributes";
    snprintf(want, sizeof want, "nodeval-%d", node[rank]);
    if (rank == leader) {
        if ((rc = PMI2_Info_PutNodeAttr("nodekey", want)) != PMI2_SUCCESS)
            die("PMI2_Info_PutNodeAttr failed: rc=%d", rc);
    } else {
        found = 0;
        val[0] = '\0';
        rc = PMI2_Info_GetNodeAttr("nodekey", val, sizeof val, &found, 1);
        if (rc != PMI2_SUCCESS || !found)
            die("PMI2_Info_GetNodeAttr(nodekey, wait) failed: rc=%d found=%d", rc, found);
        want_val("nodekey", val, want);
    }
    found = 0;
    rc = PMI2_Info_GetNodeAttr("no-such-nodekey", val, sizeof val, &found, 0);
    if (rc == PMI2_SUCCESS && found)
        die("missing node attribute found: \"%s\"", val);

    char ringval[64], left[PMI2_MAX_VALLEN + 1], right[PMI2_MAX_VALLEN + 1];
    int ringrank = -1, ringsize = -1;
    if (skip("ring"))
        goto missing;

    phase = "PMIX_Ring";
    snprintf(ringval, sizeof ringval, "ring-%d", rank);
    left[0] = right[0] = '\0';
    rc = PMIX_Ring(ringval, &ringrank, &ringsize, left, right, PMI2_MAX_VALLEN);
    if (rc != PMI2_SUCCESS)
        die("failed: rc=%d", rc);
    if (ringsize != size)
        die("ring size %d, want %d", ringsize, size);
    if (ringrank < 0 || ringrank >= size)
        die("ring position %d out of [0,%d)", ringrank, size);
    if (size == 1) {
        want_val("ring left", left, ringval);
        want_val("ring right", right, ringval);
    }

    phase = "ring cross-check";
    snprintf(key, sizeof key, "ringpos-%d", rank);
    snprintf(val, sizeof val, "%d", ringrank);
    if ((rc = PMI2_KVS_Put(key, val)) != PMI2_SUCCESS)
        die("PMI2_KVS_Put(%s) failed: rc=%d", key, rc);
    snprintf(key, sizeof key, "ringval-%d", ringrank);
    if ((rc = PMI2_KVS_Put(key, ringval)) != PMI2_SUCCESS)
        die("PMI2_KVS_Put(%s) failed: rc=%d", key, rc);
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS)
        die("second PMI2_KVS_Fence failed: rc=%d", rc);
    char *seen = calloc(size, 1);
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "ringpos-%d", r);
        kvs_get(NULL, r, key, val, sizeof val);
        int pos = atoi(val);
        if (pos < 0 || pos >= size || seen[pos])
            die("rank %d has ring position %s: positions are not a permutation", r, val);
        seen[pos] = 1;
    }
    snprintf(key, sizeof key, "ringval-%d", (ringrank + size - 1) % size);
    kvs_get(NULL, PMI2_ID_NULL, key, val, sizeof val);
    if (strcmp(left, val) != 0)
        die("at ring position %d left is \"%s\", but position %d holds \"%s\"", ringrank, left, (ringrank + size - 1) % size, val);
    snprintf(key, sizeof key, "ringval-%d", (ringrank + 1) % size);
    kvs_get(NULL, PMI2_ID_NULL, key, val, sizeof val);
    if (strcmp(right, val) != 0)
        die("at ring position %d right is \"%s\", but position %d holds \"%s\"", ringrank, right, (ringrank + 1) % size, val);

missing:
    phase = "get of a missing key";
    int len = -1;
    snprintf(key, sizeof key, "no-such-key-%d", rank);
    val[0] = '\0';
    rc = PMI2_KVS_Get(NULL, PMI2_ID_NULL, key, val, sizeof val, &len);
    if (rc == PMI2_SUCCESS)
        die("get of a key nobody put succeeded with \"%s\"", val);

    phase = "PMI2_Finalize";
    if ((rc = PMI2_Finalize()) != PMI2_SUCCESS)
        die("failed: rc=%d", rc);
    alarm(0);

    printf("pmi2 ok rank %d size %d node %d local %d/%d ring %d usize %d\n", rank, size, node[rank], localid, nlocal,
           ringrank, usize);
    fflush(stdout);
    return 0;
}
