//go:build pmix

// The C side of agent/pmix: OpenPMIx's server library, its host module
// (whose callbacks hand every request to Go through the exported fpx*
// functions and return at once) and the completions Go calls later.
// PMIx runs the callbacks on its own progress thread; nothing here blocks
// on it, and nothing waits for PMIx but the blocking helpers at the end,
// which Go calls from its own goroutines.

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pmix.h>
#include <pmix_server.h>

#include "server.h"
#include "_cgo_export.h"

// --- the library, opened when the first PMIx job starts ---------------
//
// pmirun and pmid do not link OpenPMIx: fpx_load opens it when the first
// job serving PMIx ranks starts. So they start without loading it and
// its dependencies (hwloc, libevent, udev, munge) for the PMI-1 and PMI-2
// jobs they mostly run, and a binary built with PMIx support runs on a
// host without the library, failing only its PMIx jobs, with the loader's
// reason. Everything below calls the library through the pointers
// fpx_load resolves, under the library's own names (the defines after
// the pointers), and only once fpx_load succeeded. (The header's inline
// helpers call it directly: server.c uses none of those that do, which
// the Go test TestNoPMIxLinked checks.)

#define FPX_FUNCTIONS(X)              \
    X(PMIx_Error_string)              \
    X(PMIx_Info_load)                 \
    X(PMIx_Value_load)                \
    X(PMIx_Value_destruct)            \
    X(PMIx_generate_ppn)              \
    X(PMIx_generate_regex)            \
    X(PMIx_server_init)               \
    X(PMIx_server_register_nspace)    \
    X(PMIx_server_deregister_nspace)  \
    X(PMIx_server_register_client)    \
    X(PMIx_server_setup_fork)         \
    X(PMIx_server_dmodex_request)

#define FPX_POINTER(f) static __typeof__(f) *fpx_##f;
FPX_FUNCTIONS(FPX_POINTER)

// The same functions, one define each (a macro cannot make defines).
#define PMIx_Error_string (*fpx_PMIx_Error_string)
#define PMIx_Info_load (*fpx_PMIx_Info_load)
#define PMIx_Value_load (*fpx_PMIx_Value_load)
#define PMIx_Value_destruct (*fpx_PMIx_Value_destruct)
#define PMIx_generate_ppn (*fpx_PMIx_generate_ppn)
#define PMIx_generate_regex (*fpx_PMIx_generate_regex)
#define PMIx_server_init (*fpx_PMIx_server_init)
#define PMIx_server_register_nspace (*fpx_PMIx_server_register_nspace)
#define PMIx_server_deregister_nspace (*fpx_PMIx_server_deregister_nspace)
#define PMIx_server_register_client (*fpx_PMIx_server_register_client)
#define PMIx_server_setup_fork (*fpx_PMIx_server_setup_fork)
#define PMIx_server_dmodex_request (*fpx_PMIx_server_dmodex_request)

// loaded is set, once, when every pointer is: the pointers are written
// before it and read after it.
static atomic_bool loaded;
static char load_error[512]; // why the last fpx_load failed

// fpx_load opens the library (lib: a file name or path, as for dlopen)
// and resolves the functions, unless an earlier call did. It returns NULL
// when the library is usable, else why not. Go serializes the calls
// (registry.mu).
const char *fpx_load(const char *lib)
{
    if (atomic_load(&loaded))
        return NULL;
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        snprintf(load_error, sizeof load_error, "%s", dlerror());
        return load_error;
    }
#define FPX_RESOLVE(f)                                                 \
    if ((fpx_##f = (__typeof__(fpx_##f))dlsym(h, #f)) == NULL) {       \
        snprintf(load_error, sizeof load_error, "%s has no %s", lib, #f); \
        dlclose(h);                                                    \
        return load_error;                                             \
    }
    FPX_FUNCTIONS(FPX_RESOLVE)
#undef FPX_RESOLVE
    atomic_store(&loaded, true);
    return NULL;
}

// --- host callbacks: copy what Go needs, hand it over, return ---------

static pmix_status_t queued(int rc)
{
    // Go returns 0 when it took the request (it completes it later),
    // else a PMIx status to return at once without a callback.
    return rc == 0 ? PMIX_SUCCESS : rc;
}

static fpx_cb *newcb(void *cbdata)
{
    fpx_cb *cb = calloc(1, sizeof(*cb));
    if (cb != NULL)
        cb->cbdata = cbdata;
    return cb;
}

// op_request hands over a request completed by a pmix_op_cbfunc_t.
static pmix_status_t op_request(int kind, const pmix_proc_t *proc, int code, const char *msg,
                                char **strs, int n, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    fpx_cb *cb = newcb(cbdata);
    if (cb == NULL)
        return PMIX_ERR_NOMEM;
    cb->op = cbfunc;
    int rc = fpxRequest(kind, (char *)proc->nspace, proc->rank, code, (char *)msg, strs, n, cb);
    if (rc != 0)
        free(cb);
    return queued(rc);
}

static pmix_status_t client_connected(const pmix_proc_t *proc, void *server_object,
                                      pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)server_object;
    return op_request(FPX_CONNECTED, proc, 0, NULL, NULL, 0, cbfunc, cbdata);
}

static pmix_status_t client_finalized(const pmix_proc_t *proc, void *server_object,
                                      pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)server_object;
    return op_request(FPX_FINALIZED, proc, 0, NULL, NULL, 0, cbfunc, cbdata);
}

static pmix_status_t abort_fn(const pmix_proc_t *proc, void *server_object, int status,
                              const char msg[], pmix_proc_t procs[], size_t nprocs,
                              pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)server_object;
    (void)procs;
    (void)nprocs; // whoever the rank names, the whole job ends (as PMI-2 abort)
    return op_request(FPX_ABORT, proc, status, msg, NULL, 0, cbfunc, cbdata);
}

// whole reports whether procs name every rank of one nspace (a wildcard,
// or each rank once), the only fence fastpmi serves; it stores the nspace.
static int whole(const pmix_proc_t procs[], size_t nprocs, const char **ns)
{
    if (nprocs == 0)
        return 0;
    *ns = procs[0].nspace;
    for (size_t i = 0; i < nprocs; i++) {
        if (strncmp(procs[i].nspace, *ns, PMIX_MAX_NSLEN) != 0)
            return 0;
        if (procs[i].rank == PMIX_RANK_WILDCARD && nprocs != 1)
            return 0;
    }
    if (nprocs == 1 && procs[0].rank == PMIX_RANK_WILDCARD)
        return 1;
    return -(int)nprocs; // Go checks that they are every rank
}

// timeout_of is the PMIX_TIMEOUT in info, in whole seconds (0: none).
// The standard types it an int, but OpenPMIx and PRRTE read it as any
// number (PMIX_VALUE_GET_NUMBER), and clients pass a size_t, a uint64,
// ...: a timeout read only as an int was dropped for those, and the
// fence or get it bounded waited for ever. A fraction of a second is a
// second, not "none".
static int timeout_of(const pmix_info_t info[], size_t ninfo)
{
    for (size_t i = 0; i < ninfo; i++) {
        if (!PMIX_CHECK_KEY(&info[i], PMIX_TIMEOUT))
            continue;
        pmix_status_t rc;
        double secs = 0;
        PMIX_VALUE_GET_NUMBER(rc, &info[i].value, secs, double);
        if (rc != PMIX_SUCCESS || !(secs > 0))
            return 0;
        if (secs >= 0x7fffffff)
            return 0x7fffffff;
        return secs < 1 ? 1 : (int)secs;
    }
    return 0;
}

// jobs_request hands over a collective over procs of several namespaces
// (or of part of one), which only the launcher can complete across
// nodes: a fence (modex set) or a connect or disconnect (op set). Its
// PMIX_TIMEOUT in info is the host's, as a fence's (fence_nb).
static pmix_status_t jobs_request(int kind, const pmix_proc_t procs[], size_t nprocs,
                                  const pmix_info_t info[], size_t ninfo, char *data, size_t ndata,
                                  pmix_modex_cbfunc_t modex, pmix_op_cbfunc_t op, void *cbdata)
{
    if (nprocs == 0)
        return PMIX_ERR_BAD_PARAM;
    char **ns = calloc(nprocs, sizeof(*ns));
    unsigned int *ranks = calloc(nprocs, sizeof(*ranks));
    fpx_cb *cb = newcb(cbdata);
    int rc = PMIX_ERR_NOMEM;
    if (ns != NULL && ranks != NULL && cb != NULL) {
        for (size_t i = 0; i < nprocs; i++) {
            ns[i] = (char *)procs[i].nspace; // Go copies them before it returns
            ranks[i] = procs[i].rank;
        }
        cb->modex = modex;
        cb->op = op;
        rc = fpxJobsRequest(kind, ns, ranks, (int)nprocs, timeout_of(info, ninfo), data, (int)ndata, cb);
        if (rc == 0)
            cb = NULL; // Go's now
        rc = queued(rc);
    }
    free(ns);
    free(ranks);
    free(cb);
    return rc;
}

static pmix_status_t fence_nb(const pmix_proc_t procs[], size_t nprocs,
                              const pmix_info_t info[], size_t ninfo,
                              char *data, size_t ndata,
                              pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    // PMIX_COLLECT_DATA is the server library's business: it sends data
    // or not. A PMIX_TIMEOUT is the host's once the library hands the
    // fence over (it times out only fences still waiting for local
    // clients): Go fails the fence when it passes.
    const char *ns = NULL;
    int w = whole(procs, nprocs, &ns);
    if (w == 0)
        return jobs_request(FPX_JOBS_FENCE, procs, nprocs, info, ninfo, data, ndata, cbfunc, NULL, cbdata);
    if (w < 0) {
        // An explicit list: Go accepts it only if it names every rank.
        unsigned int *ranks = malloc(nprocs * sizeof(*ranks));
        if (ranks == NULL)
            return PMIX_ERR_NOMEM;
        for (size_t i = 0; i < nprocs; i++)
            ranks[i] = procs[i].rank;
        int ok = fpxWholeJob((char *)ns, ranks, (int)nprocs);
        free(ranks);
        if (!ok)
            return jobs_request(FPX_JOBS_FENCE, procs, nprocs, info, ninfo, data, ndata, cbfunc, NULL,
                                cbdata);
    }
    fpx_cb *cb = newcb(cbdata);
    if (cb == NULL)
        return PMIX_ERR_NOMEM;
    cb->modex = cbfunc;
    int rc = fpxRequest(FPX_FENCE, (char *)ns, PMIX_RANK_WILDCARD, timeout_of(info, ninfo), data, NULL,
                        (int)ndata, cb);
    if (rc != 0)
        free(cb);
    return queued(rc);
}

// dmodex asks for the data of a rank of another node, which only that
// node's server library holds: Go fetches it through the agent, from the
// rank's node (rank_data below answers there). A PMIX_TIMEOUT the client
// gave is the host's to apply (the server library sets none on the
// request it hands over).
//
// The direct modex requests handed to Go and not answered yet, by the
// library's cbdata: when Go registers the namespace of another job while
// a request for one of its ranks waits (Job.foreignNspace), the library
// asks the host again with the same cbdata, and a cbdata must be
// answered once (the library frees it with the answer).
static pthread_mutex_t dmx_mu = PTHREAD_MUTEX_INITIALIZER;
static void **dmx_pending;
static size_t dmx_n, dmx_cap;

// dmx_add records cbdata as waiting; it returns 0 if it already was.
static int dmx_add(void *cbdata)
{
    int added = 1;
    pthread_mutex_lock(&dmx_mu);
    for (size_t i = 0; i < dmx_n; i++)
        if (dmx_pending[i] == cbdata)
            added = 0;
    if (added && dmx_n == dmx_cap) {
        size_t cap = dmx_cap ? 2 * dmx_cap : 16;
        void **p = realloc(dmx_pending, cap * sizeof(*p));
        if (p == NULL)
            added = -1;
        else
            dmx_pending = p, dmx_cap = cap;
    }
    if (added == 1)
        dmx_pending[dmx_n++] = cbdata;
    pthread_mutex_unlock(&dmx_mu);
    return added;
}

// dmx_remove forgets cbdata, if it waits.
static void dmx_remove(void *cbdata)
{
    pthread_mutex_lock(&dmx_mu);
    for (size_t i = 0; i < dmx_n; i++) {
        if (dmx_pending[i] == cbdata) {
            dmx_pending[i] = dmx_pending[--dmx_n];
            break;
        }
    }
    pthread_mutex_unlock(&dmx_mu);
}

static pmix_status_t dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                            pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    if (proc->rank == PMIX_RANK_UNDEF)
        return PMIX_ERR_NOT_SUPPORTED;
    // A wildcard rank asks for job data: Go answers it for a namespace
    // of another job (it registers the namespace), and refuses it for
    // one of its own (registered here already).
    switch (dmx_add(cbdata)) {
    case 0:
        return PMIX_SUCCESS; // asked again: the first request's answer completes it
    case -1:
        return PMIX_ERR_NOMEM;
    }
    int timeout = timeout_of(info, ninfo);
    fpx_cb *cb = newcb(cbdata);
    if (cb == NULL) {
        dmx_remove(cbdata);
        return PMIX_ERR_NOMEM;
    }
    cb->modex = cbfunc;
    int rc = fpxRequest(FPX_DMODEX, (char *)proc->nspace, proc->rank, timeout, NULL, NULL, 0, cb);
    if (rc != 0) {
        dmx_remove(cbdata);
        free(cb);
    }
    return queued(rc);
}

// Published values are strings in the name service. A string is
// published as it is (so MPI_Lookup_name of a PMI rank finds the port of
// a PMIx rank); a byte object — Open MPI's allreduce of the communicator
// id across a connect/accept bridge exchanges one — as bo_prefix and its
// bytes in hex, and turned back into a byte object by a lookup.
static const char bo_prefix[] = "pmix-bo:";
enum { bo_max = 4096 }; // bytes of a byte object; the name service bounds the string further

static char *bo_encode(const pmix_byte_object_t *bo)
{
    static const char hex[] = "0123456789abcdef";
    if (bo->size > bo_max)
        return NULL;
    size_t n = sizeof(bo_prefix) - 1;
    char *s = malloc(n + 2 * bo->size + 1);
    if (s == NULL)
        return NULL;
    memcpy(s, bo_prefix, n);
    for (size_t i = 0; i < bo->size; i++) {
        unsigned char c = (unsigned char)bo->bytes[i];
        s[n++] = hex[c >> 4];
        s[n++] = hex[c & 15];
    }
    s[n] = '\0';
    return s;
}

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

// bo_decode loads v with the byte object s encodes, and reports whether
// s is one (else v is untouched).
static int bo_decode(const char *s, pmix_value_t *v)
{
    size_t n = sizeof(bo_prefix) - 1;
    if (strncmp(s, bo_prefix, n) != 0)
        return 0;
    s += n;
    size_t len = strlen(s);
    if (len % 2 != 0 || len / 2 > bo_max)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (unhex(s[i]) < 0)
            return 0;
    char *b = malloc(len / 2 + 1);
    if (b == NULL)
        return 0;
    for (size_t i = 0; i < len / 2; i++)
        b[i] = (char)(unhex(s[2 * i]) << 4 | unhex(s[2 * i + 1]));
    v->type = PMIX_BYTE_OBJECT;
    v->data.bo.bytes = b; // freed with the value
    v->data.bo.size = len / 2;
    return 1;
}

// publish hands over the names as key, value, ...; code is 1 when they
// are to go at their first lookup (PMIX_PERSIST_FIRST_READ: Open MPI's
// connect/accept exchange), else 0: they stay until unpublished. Values
// are strings and byte objects; anything else is not supported.
static pmix_status_t publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                             pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    size_t n = 0;
    int once = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_PERSISTENCE)) {
            once = info[i].value.type == PMIX_PERSIST && info[i].value.data.persist == PMIX_PERSIST_FIRST_READ;
            continue;
        }
        if (!PMIX_CHECK_RESERVED_KEY(info[i].key))
            n++;
    }
    if (n == 0)
        return PMIX_ERR_BAD_PARAM;
    // keys and values alternate in one NULL-ended array: key, value, ...;
    // enc holds the values encoded here, freed after the hand-over.
    char **kv = calloc(2 * n + 1, sizeof(char *));
    char **enc = calloc(n, sizeof(char *));
    pmix_status_t rc = PMIX_ERR_NOMEM;
    if (kv == NULL || enc == NULL)
        goto out;
    size_t k = 0, e = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_RESERVED_KEY(info[i].key))
            continue;
        const pmix_value_t *v = &info[i].value;
        kv[k++] = (char *)info[i].key;
        if (v->type == PMIX_STRING && v->data.string != NULL) {
            kv[k++] = v->data.string;
        } else if (v->type == PMIX_BYTE_OBJECT) {
            if ((enc[e] = bo_encode(&v->data.bo)) == NULL) {
                rc = v->data.bo.size > bo_max ? PMIX_ERR_BAD_PARAM : PMIX_ERR_NOMEM;
                goto out;
            }
            kv[k++] = enc[e++];
        } else {
            rc = PMIX_ERR_NOT_SUPPORTED;
            goto out;
        }
    }
    rc = op_request(FPX_PUBLISH, proc, once, NULL, kv, (int)(2 * n), cbfunc, cbdata);
out:
    for (size_t i = 0; enc != NULL && i < n; i++)
        free(enc[i]);
    free(enc);
    free(kv);
    return rc;
}

static int count(char **keys)
{
    int n = 0;
    while (keys != NULL && keys[n] != NULL)
        n++;
    return n;
}

// lookup hands over the keys; code is -1 for an answer at once, else the
// lookup waits until every key is published (PMIX_WAIT, whatever its
// value), for code seconds (PMIX_TIMEOUT; 0: for ever).
static pmix_status_t lookup(const pmix_proc_t *proc, char **keys, const pmix_info_t info[], size_t ninfo,
                            pmix_lookup_cbfunc_t cbfunc, void *cbdata)
{
    int wait = -1;
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_WAIT))
            wait = timeout_of(info, ninfo);
    int n = count(keys);
    if (n == 0)
        return PMIX_ERR_BAD_PARAM;
    fpx_cb *cb = newcb(cbdata);
    if (cb == NULL)
        return PMIX_ERR_NOMEM;
    cb->lookup = cbfunc;
    int rc = fpxRequest(FPX_LOOKUP, (char *)proc->nspace, proc->rank, wait, NULL, keys, n, cb);
    if (rc != 0)
        free(cb);
    return queued(rc);
}

static pmix_status_t unpublish(const pmix_proc_t *proc, char **keys, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)info;
    (void)ninfo;
    int n = count(keys);
    if (n == 0)
        return PMIX_ERR_NOT_SUPPORTED; // "everything this rank published": not tracked
    return op_request(FPX_UNPUBLISH, proc, 0, NULL, keys, n, cbfunc, cbdata);
}

// strlist collects strings for Go (fpxRequest's strs), growing as it
// goes; ok is 0 once an allocation failed.
typedef struct {
    char **s;
    int n, cap, ok;
} strlist;

static void add(strlist *l, const char *s)
{
    if (!l->ok)
        return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        char **p = realloc(l->s, (size_t)cap * sizeof(char *));
        if (p == NULL) {
            l->ok = 0;
            return;
        }
        l->s = p;
        l->cap = cap;
    }
    l->s[l->n++] = (char *)(s != NULL ? s : "");
}

// spawn hands over the apps as strings, per app: cmd, maxprocs, cwd,
// argc, argv[1..argc], envc, env[0..envc-1], 2·ninfo and ninfo pairs of
// key and value (the string-valued info keys only: host, hostfile,
// wdir, ...; Go ignores the keys it does not serve, as Hydra does). The
// job-level info (Open MPI's personality, mapping directives) is not
// served. The numbers are written into bufs, which live until fpxRequest
// returned (it copies what it keeps).
static pmix_status_t spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
                           const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cbfunc, void *cbdata)
{
    (void)job_info;
    (void)ninfo;
    if (napps == 0 || napps > 1024)
        return PMIX_ERR_BAD_PARAM;
    char (*num)[4][16] = calloc(napps, sizeof(*num));
    if (num == NULL)
        return PMIX_ERR_NOMEM;
    strlist l = {.ok = 1};
    for (size_t a = 0; a < napps; a++) {
        const pmix_app_t *app = &apps[a];
        int argc = 0, envc = 0, nstr = 0;
        while (app->argv != NULL && app->argv[argc] != NULL)
            argc++;
        while (app->env != NULL && app->env[envc] != NULL)
            envc++;
        for (size_t i = 0; i < app->ninfo; i++)
            if (app->info[i].value.type == PMIX_STRING && app->info[i].value.data.string != NULL)
                nstr++;
        snprintf(num[a][0], sizeof(num[a][0]), "%d", app->maxprocs);
        snprintf(num[a][1], sizeof(num[a][1]), "%d", argc > 0 ? argc - 1 : 0);
        snprintf(num[a][2], sizeof(num[a][2]), "%d", envc);
        snprintf(num[a][3], sizeof(num[a][3]), "%d", 2 * nstr);
        add(&l, app->cmd != NULL ? app->cmd : (argc > 0 ? app->argv[0] : NULL));
        add(&l, num[a][0]);
        add(&l, app->cwd);
        add(&l, num[a][1]);
        for (int i = 1; i < argc; i++)
            add(&l, app->argv[i]);
        add(&l, num[a][2]);
        for (int i = 0; i < envc; i++)
            add(&l, app->env[i]);
        add(&l, num[a][3]);
        for (size_t i = 0; i < app->ninfo; i++) {
            if (app->info[i].value.type != PMIX_STRING || app->info[i].value.data.string == NULL)
                continue;
            add(&l, app->info[i].key);
            add(&l, app->info[i].value.data.string);
        }
    }
    pmix_status_t rc = PMIX_ERR_NOMEM;
    fpx_cb *cb = l.ok ? newcb(cbdata) : NULL;
    if (cb != NULL) {
        cb->spawn = cbfunc;
        int r = fpxRequest(FPX_SPAWN, (char *)proc->nspace, proc->rank, (int)napps, NULL, l.s, l.n, cb);
        if (r != 0)
            free(cb);
        rc = queued(r);
    }
    free(l.s);
    free(num);
    return rc;
}

// connect and disconnect reach the host only when some participant is
// not a client of this server (the library completes them by itself
// among its own clients): the launcher joins the nodes hosting them.
static pmix_status_t connect_fn(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    return jobs_request(FPX_CONNECT, procs, nprocs, info, ninfo, NULL, 0, NULL, cbfunc, cbdata);
}

static pmix_status_t disconnect_fn(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                   size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    return jobs_request(FPX_DISCONNECT, procs, nprocs, info, ninfo, NULL, 0, NULL, cbfunc, cbdata);
}

// notify_event is a client's event for processes beyond its node's
// server (PMIx_Notify_event with a range wider than the node). The
// library delivers it to its own clients itself and has answered the
// notifier already; fastpmi carries no events between nodes, so Go says
// on the job's log that the ranks of its other nodes do not get it, where
// it was lost without a word.
static pmix_status_t notify_event(pmix_status_t code, const pmix_proc_t *source, pmix_data_range_t range,
                                  pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)info;
    (void)ninfo;
    (void)cbfunc;
    (void)cbdata;
    return fpxNotifyEvent((char *)source->nspace, source->rank, code, (int)range);
}

static pmix_server_module_t module = {
    .client_connected = client_connected,
    .client_finalized = client_finalized,
    .abort = abort_fn,
    .fence_nb = fence_nb,
    .direct_modex = dmodex,
    .publish = publish,
    .lookup = lookup,
    .unpublish = unpublish,
    .spawn = spawn,
    .connect = connect_fn,
    .disconnect = disconnect_fn,
    .notify_event = notify_event,
};

// --- rank data: a local rank's data for another node --------------------

typedef struct {
    char nspace[PMIX_MAX_NSLEN + 1];
    unsigned long long id;
    int rank; // -1: a wildcard request (job data), which Go uses as a marker
} rank_data_req;

static void rank_data_done(pmix_status_t status, char *data, size_t sz, void *cbdata)
{
    rank_data_req *rq = cbdata;
    if (sz > 0x7fffffff) {
        status = PMIX_ERR_NOMEM;
        sz = 0;
    }
    fpxRankData(rq->nspace, rq->id, rq->rank, status, data, (int)sz);
    free(rq);
}

// fpx_rank_data asks the server library for the data local rank (of
// nspace) committed, or with rank -1 for the namespace's job data; the
// answer reaches Go's fpxRankData with id, on PMIx's progress thread,
// once the rank committed (never, if it never does). The library runs
// such requests on its progress thread in the order they are made.
int fpx_rank_data(const char *nspace, int rank, unsigned long long id)
{
    rank_data_req *rq = calloc(1, sizeof(*rq));
    if (rq == NULL)
        return PMIX_ERR_NOMEM;
    PMIX_LOAD_NSPACE(rq->nspace, nspace);
    rq->id = id;
    rq->rank = rank;
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, nspace, rank < 0 ? PMIX_RANK_WILDCARD : (pmix_rank_t)rank);
    pmix_status_t rc = PMIx_server_dmodex_request(&proc, rank_data_done, rq);
    if (rc != PMIX_SUCCESS)
        free(rq);
    return rc;
}

// --- completions, called from Go ---------------------------------------

void fpx_op_done(fpx_cb *cb, int status)
{
    if (cb->op != NULL)
        cb->op(status, cb->cbdata);
    free(cb);
}

static void release_blob(void *p) { free(p); }

void fpx_modex_done(fpx_cb *cb, int status, const char *data, int n)
{
    dmx_remove(cb->cbdata); // a fence's was never there
    char *copy = NULL;
    if (status == PMIX_SUCCESS && n > 0) {
        copy = malloc((size_t)n);
        if (copy == NULL) {
            status = PMIX_ERR_NOMEM;
            n = 0;
        } else {
            memcpy(copy, data, (size_t)n);
        }
    } else {
        n = 0;
    }
    // PMIx holds the blob until it calls release_blob.
    cb->modex(status, copy, (size_t)n, cb->cbdata, copy != NULL ? release_blob : NULL, copy);
    free(cb);
}

void fpx_lookup_done(fpx_cb *cb, int status, const char *nspace, char **kv, int n)
{
    pmix_pdata_t *pd = NULL;
    size_t npd = (size_t)n / 2;
    if (status == PMIX_SUCCESS && npd > 0) {
        PMIX_PDATA_CREATE(pd, npd);
        for (size_t i = 0; i < npd; i++) {
            PMIX_LOAD_PROCID(&pd[i].proc, nspace, PMIX_RANK_WILDCARD);
            PMIX_LOAD_KEY(pd[i].key, kv[2 * i]);
            if (!bo_decode(kv[2 * i + 1], &pd[i].value))
                PMIX_VALUE_LOAD(&pd[i].value, kv[2 * i + 1], PMIX_STRING);
        }
    } else {
        npd = 0;
    }
    cb->lookup(status, pd, npd, cb->cbdata);
    if (pd != NULL) {
        // PMIX_PDATA_FREE's helper in the header calls the library
        // directly, not through fpx_load's pointer.
        for (size_t i = 0; i < npd; i++)
            PMIX_PDATA_DESTRUCT(&pd[i]);
        pmix_free(pd);
    }
    free(cb);
}

void fpx_spawn_done(fpx_cb *cb, int status, const char *nspace)
{
    pmix_nspace_t ns;
    PMIX_LOAD_NSPACE(ns, status == PMIX_SUCCESS ? nspace : NULL);
    cb->spawn(status, ns, cb->cbdata);
    free(cb);
}

// --- blocking helpers, for Go's goroutines (never the progress thread) --

// waiter is a caller waiting for one PMIx callback. It lives on the heap
// with two references, the caller's and the callback's: a caller that
// stops waiting (waiter_wait with a bound) leaves it to the late
// callback to free.
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, refs;
    pmix_status_t status;
} waiter;

static waiter *waiter_new(void)
{
    waiter *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->refs = 2;
    w->status = PMIX_SUCCESS;
    return w;
}

static void waiter_unref(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    int left = --w->refs;
    pthread_mutex_unlock(&w->mu);
    if (left == 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
}

static void waiter_done(pmix_status_t status, void *cbdata)
{
    waiter *w = cbdata;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    waiter_unref(w);
}

// waiter_wait returns the callback's status when rc (the call's) says a
// callback comes, else rc; with secs > 0 it waits at most that long and
// then returns PMIX_ERR_TIMEOUT. It drops the caller's reference (and
// the callback's when none comes).
static pmix_status_t waiter_wait(waiter *w, pmix_status_t rc, int secs)
{
    if (rc != PMIX_SUCCESS) {
        if (rc == PMIX_OPERATION_SUCCEEDED)
            rc = PMIX_SUCCESS;
        waiter_unref(w); // no callback comes
        waiter_unref(w);
        return rc;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += secs;
    pthread_mutex_lock(&w->mu);
    int late = 0;
    while (!w->done && !late) {
        if (secs > 0)
            late = pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT;
        else
            pthread_cond_wait(&w->cv, &w->mu);
    }
    rc = w->done ? w->status : PMIX_ERR_TIMEOUT;
    pthread_mutex_unlock(&w->mu);
    waiter_unref(w);
    return rc;
}

// fpx_init starts the server. Its threads (the progress thread, and
// those it starts) are made with SIGPIPE blocked: they write to clients'
// sockets, a client may die at any time, and a SIGPIPE on a thread Go
// did not make ends the process (Go's handler forwards it to the
// default action), which made a job's verdict pmirun's death by SIGPIPE
// now and then, when a rank was killed. Blocked, the write fails with
// EPIPE, which the library handles as a lost client. The calling thread's
// mask is restored.
int fpx_init(const char *tmpdir)
{
    sigset_t pipe, old;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old);
    pmix_info_t *info;
    PMIX_INFO_CREATE(info, 4);
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
    bool no = false, yes = true;
    PMIX_INFO_LOAD(&info[2], PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[3], PMIX_SERVER_SHARE_TOPOLOGY, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_server_init(&module, info, 4);
    PMIX_INFO_FREE(info, 4);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}


const char *fpx_error(int status)
{
    return atomic_load(&loaded) ? PMIx_Error_string(status) : "(OpenPMIx not loaded)";
}

static void load_u32(pmix_info_t *i, const char *key, uint32_t v) { PMIX_INFO_LOAD(i, key, &v, PMIX_UINT32); }
static void load_u16(pmix_info_t *i, const char *key, uint16_t v) { PMIX_INFO_LOAD(i, key, &v, PMIX_UINT16); }
static void load_rank(pmix_info_t *i, const char *key, pmix_rank_t v) { PMIX_INFO_LOAD(i, key, &v, PMIX_PROC_RANK); }

int fpx_register_nspace(const fpx_job *j)
{
    if (j->size == 0) { // another job's namespace, not known to the launcher
        waiter *w = waiter_new();
        if (w == NULL)
            return PMIX_ERR_NOMEM;
        return waiter_wait(w, PMIx_server_register_nspace(j->nspace, 0, NULL, 0, waiter_done, w), 0);
    }
    char *nodemap = NULL, *procmap = NULL;
    pmix_status_t rc = PMIx_generate_regex(j->nodelist, &nodemap);
    if (rc != PMIX_SUCCESS)
        return rc;
    rc = PMIx_generate_ppn(j->ppn, &procmap);
    if (rc != PMIX_SUCCESS) {
        free(nodemap);
        return rc;
    }
    bool here = j->node >= 0; // else another job's namespace, no rank here
    size_t njob = 14;
    size_t ninfo = njob + (size_t)j->size;
    pmix_info_t *info;
    PMIX_INFO_CREATE(info, ninfo);
    size_t k = 0;
    if (j->usize > 0) {
        load_u32(&info[k++], PMIX_UNIV_SIZE, (uint32_t)j->usize);
        load_u32(&info[k++], PMIX_MAX_PROCS, (uint32_t)j->usize);
    }
    load_u32(&info[k++], PMIX_JOB_SIZE, (uint32_t)j->size);
    PMIX_INFO_LOAD(&info[k++], PMIX_JOBID, j->nspace, PMIX_STRING);
    load_u32(&info[k++], PMIX_NUM_NODES, (uint32_t)j->nnodes);
    PMIX_INFO_LOAD(&info[k++], PMIX_NODE_MAP, nodemap, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[k++], PMIX_PROC_MAP, procmap, PMIX_REGEX);
    bool spawned = j->parent != NULL;
    if (here) {
        PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_PEERS, j->peers, PMIX_STRING);
        load_u32(&info[k++], PMIX_LOCAL_SIZE, (uint32_t)j->nlocal);
        load_u32(&info[k++], PMIX_NODE_SIZE, (uint32_t)j->nlocal);
        load_rank(&info[k++], PMIX_LOCALLDR, (pmix_rank_t)j->leader);
        load_u32(&info[k++], PMIX_NODEID, (uint32_t)j->node);
        PMIX_INFO_LOAD(&info[k++], PMIX_HOSTNAME, j->hostnames[j->node], PMIX_STRING);
        PMIX_INFO_LOAD(&info[k++], PMIX_SPAWNED, &spawned, PMIX_BOOL);
    }
    pmix_proc_t parent;
    if (spawned)
        PMIX_LOAD_PROCID(&parent, j->parent, (pmix_rank_t)j->parent_rank);
    for (int r = 0; r < j->size; r++) {
        pmix_data_array_t *da;
        PMIX_DATA_ARRAY_CREATE(da, 10, PMIX_INFO);
        pmix_info_t *p = da->array;
        size_t n = 0;
        load_rank(&p[n++], PMIX_RANK, (pmix_rank_t)r);
        load_u16(&p[n++], PMIX_LOCAL_RANK, (uint16_t)j->lrank[r]);
        load_u16(&p[n++], PMIX_NODE_RANK, (uint16_t)j->lrank[r]);
        load_u32(&p[n++], PMIX_NODEID, (uint32_t)j->nodeof[r]);
        PMIX_INFO_LOAD(&p[n++], PMIX_HOSTNAME, j->hostnames[j->nodeof[r]], PMIX_STRING);
        load_rank(&p[n++], PMIX_GLOBAL_RANK, (pmix_rank_t)r);
        if (j->appnum != NULL) {
            load_u32(&p[n++], PMIX_APPNUM, (uint32_t)j->appnum[r]);
            load_rank(&p[n++], PMIX_APP_RANK, (pmix_rank_t)j->apprank[r]);
        }
        if (here) {
            // Per rank too, as PMIx clients ask for them (PMIx_Get of
            // their own rank's PMIX_SPAWNED and PMIX_PARENT_ID: "was I
            // spawned, and by whom"; OpenPMIx's PMI-2 library asks so for
            // PMIX_SPAWNED).
            PMIX_INFO_LOAD(&p[n++], PMIX_SPAWNED, &spawned, PMIX_BOOL);
            if (spawned)
                PMIX_INFO_LOAD(&p[n++], PMIX_PARENT_ID, &parent, PMIX_PROC);
        }
        da->size = n;
        PMIX_LOAD_KEY(info[k].key, PMIX_PROC_DATA);
        info[k].value.type = PMIX_DATA_ARRAY;
        info[k].value.data.darray = da; // freed with info
        k++;
    }
    waiter *w = waiter_new();
    if (w == NULL) {
        rc = PMIX_ERR_NOMEM;
    } else {
        // No bound: the library holds info until it calls back. A
        // namespace without local clients (nlocal 0) is one whose
        // clients the library does not wait for: a fence or disconnect
        // naming it waits for none of them here.
        rc = PMIx_server_register_nspace(j->nspace, j->nlocal, info, k, waiter_done, w);
        rc = waiter_wait(w, rc, 0);
    }
    PMIX_INFO_FREE(info, ninfo);
    free(nodemap);
    free(procmap);
    return rc;
}

// A deregistration in flight: its namespace and its waiter.
typedef struct {
    pmix_nspace_t nspace;
    waiter *w;
} dereg;

// dereg_call makes the call on a thread of its own, which returns once
// the library took the request: a library whose progress thread spins
// (OpenPMIx 4.2 after a PMIx_Connect with PMIX_TIMEOUT that a local
// client never joined) blocks the call itself, for ever.
static void *dereg_call(void *arg)
{
    dereg *d = arg;
    PMIx_server_deregister_nspace(d->nspace, waiter_done, d->w);
    free(d);
    return NULL;
}

// fpx_deregister_nspace waits at most secs for the library (it copies
// nspace): a job's end must not wait for ever on a library that lost
// track of a client that died, or that is stuck (dereg_call).
int fpx_deregister_nspace(const char *nspace, int secs)
{
    waiter *w = waiter_new();
    dereg *d = calloc(1, sizeof(*d));
    if (w == NULL || d == NULL) {
        free(w);
        free(d);
        return PMIX_ERR_NOMEM;
    }
    snprintf(d->nspace, sizeof(d->nspace), "%s", nspace);
    d->w = w;
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, dereg_call, d);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        free(d);
        PMIx_server_deregister_nspace(nspace, waiter_done, w);
    }
    return waiter_wait(w, PMIX_SUCCESS, secs);
}

int fpx_register_client(const char *nspace, int rank, int uid, int gid, char ***env)
{
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, nspace, (pmix_rank_t)rank);
    waiter *w = waiter_new();
    if (w == NULL)
        return PMIX_ERR_NOMEM;
    pmix_status_t rc = PMIx_server_register_client(&proc, (uid_t)uid, (gid_t)gid, NULL, waiter_done, w);
    rc = waiter_wait(w, rc, 0);
    if (rc != PMIX_SUCCESS)
        return rc;
    *env = NULL;
    return PMIx_server_setup_fork(&proc, env);
}

void fpx_free_env(char **env)
{
    for (int i = 0; env != NULL && env[i] != NULL; i++)
        free(env[i]);
    free(env);
}

char *fpx_env_at(char **env, int i) { return env == NULL ? NULL : env[i]; }

char *fpx_str_at(char **a, int i) { return a[i]; }
unsigned int fpx_uint_at(unsigned int *a, int i) { return a[i]; }
void fpx_free(char *p) { free(p); }
char **fpx_strs(int n) { return calloc((size_t)n + 1, sizeof(char *)); }
void fpx_strs_set(char **a, int i, char *s) { a[i] = s; }
void fpx_strs_free(char **a, int n)
{
    for (int i = 0; i < n; i++)
        free(a[i]);
    free(a);
}
int *fpx_ints(int n) { return calloc((size_t)n + 1, sizeof(int)); }
void fpx_ints_set(int *a, int i, int v) { a[i] = v; }
void fpx_free_ints(int *a) { free(a); }
