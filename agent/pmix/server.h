//go:build pmix

#ifndef FASTPMI_PMIX_SERVER_H
#define FASTPMI_PMIX_SERVER_H

#include <pmix_server.h>

// Request kinds handed to Go (fpxRequest).
enum {
    FPX_CONNECTED = 1,
    FPX_FINALIZED,
    FPX_ABORT,
    FPX_FENCE,
    FPX_PUBLISH,
    FPX_LOOKUP,
    FPX_UNPUBLISH,
    FPX_DMODEX,
    FPX_SPAWN,
    // Collectives over ranks of several namespaces (fpxJobsRequest).
    FPX_JOBS_FENCE,
    FPX_CONNECT,
    FPX_DISCONNECT,
};

// fpx_cb is one request's completion: the PMIx callback to call and its
// data. Go holds it until it calls exactly one fpx_*_done, which frees it.
typedef struct {
    pmix_op_cbfunc_t op;
    pmix_modex_cbfunc_t modex;
    pmix_lookup_cbfunc_t lookup;
    pmix_spawn_cbfunc_t spawn;
    void *cbdata;
} fpx_cb;

// fpx_job is what PMIx_server_register_nspace needs of one job on one
// node; arrays by global rank have size entries, hostnames nnodes. node
// is -1 for another job of the run with no rank on this node: nlocal is
// then 0, peers, appnum, apprank and parent NULL, usize 0 (not known);
// size 0 registers a namespace without job data (its layout not known).
typedef struct {
    const char *nspace;
    int size, usize, nnodes, node, nlocal, leader;
    const char *nodelist; // "host0,host1,..."
    const char *ppn;      // "0,1;2,3": ranks of each node
    const char *peers;    // "0,1": ranks of this node
    char **hostnames;
    const int *nodeof, *lrank, *appnum, *apprank;
    // parent, for a job started by a spawn, is the namespace that spawned
    // it and parent_rank its rank that did (PMIX_SPAWNED, PMIX_PARENT_ID);
    // NULL otherwise.
    const char *parent;
    int parent_rank;
} fpx_job;

void fpx_op_done(fpx_cb *cb, int status);
void fpx_modex_done(fpx_cb *cb, int status, const char *data, int n);
void fpx_lookup_done(fpx_cb *cb, int status, const char *nspace, char **kv, int n);
void fpx_spawn_done(fpx_cb *cb, int status, const char *nspace);

const char *fpx_load(const char *lib);
int fpx_init(const char *tmpdir);
const char *fpx_error(int status);
int fpx_register_nspace(const fpx_job *j);
int fpx_deregister_nspace(const char *nspace, int secs);
int fpx_register_client(const char *nspace, int rank, int uid, int gid, char ***env);
int fpx_rank_data(const char *nspace, int rank, unsigned long long id);
void fpx_free_env(char **env);
char *fpx_env_at(char **env, int i);

// Small helpers for Go, which cannot index C arrays without unsafe.
char *fpx_str_at(char **a, int i);
unsigned int fpx_uint_at(unsigned int *a, int i);
void fpx_free(char *p);
char **fpx_strs(int n);
void fpx_strs_set(char **a, int i, char *s);
void fpx_strs_free(char **a, int n);
int *fpx_ints(int n);
void fpx_ints_set(int *a, int i, int v);
void fpx_free_ints(int *a);

#endif
