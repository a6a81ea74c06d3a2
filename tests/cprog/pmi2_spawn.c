/* pmi2_spawn: PMI2_Job_Spawn through Slurm's libpmi2, parent and children
 * in one program.
 *
 * Parent (not spawned): rank 0 spawns two commands at once (the program
 * itself as "child A" with SPAWN_N processes, default 2, and as "child B"
 * with one), with the pre-put key PARENT_KEY = "from-<parent job id>" and
 * the info keys wdir=SPAWN_WDIR (if set, command A only) and a key no
 * launcher knows (ignored). It checks the returned job id differs from its
 * own, then looks up the name child-<r> of every child (published by the
 * children, so the name service spans jobs) and checks each value.
 * Every parent rank prints "parent ok rank R children C jobid J".
 *
 * SPAWN_MODE=missing: rank 0 spawns a program that does not exist; the
 * spawn must fail (non-zero return) and the parent carry on: it prints
 * "parent ok rank R spawn refused". SPAWN_MODE=badwdir: the same with the
 * program itself and the info key wdir=/fastpmi-no-such-dir.
 *
 * SPAWN_MODE=childfail: child rank 0 exits with code 7 after PMI2_Init
 * (the launcher must end every job, the parent waiting for its names
 * included); SPAWN_MODE=childabort: it calls PMI2_Abort with code 9.
 *
 * Child (spawned): PMI2_Init says spawned, PMI_SPAWNED=1, size is the sum
 * of the commands' processes, appnum is 0 for "A" and 1 for "B" (argv[2]),
 * ranks 0..SPAWN_N-1 are A's; the job id differs from the parent's, whose
 * pre-put key is readable before the first fence; with SPAWN_WDIR, A's
 * ranks start there. The children then put, fence and get each other's
 * keys, publish child-<rank> = "<appnum>:<arg>:<PARENT_KEY value>", and
 * print "child ok rank R size S appnum A".
 *
 * Any mismatch goes to stderr and exits 1; a hang of more than 60 s
 * exits 3. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/pmi2.h>

static const char *who = "?";
static int me = -1;

static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "pmi2_spawn: %s rank %d: ", who, me);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void on_alarm(int sig)
{
    (void)sig;
    if (write(2, "pmi2_spawn: hung\n", 17) < 0) {
        /* nothing left to do */
    }
    _exit(3);
}

static int nchildren(void)
{
    const char *s = getenv("SPAWN_N");
    return s ? atoi(s) : 2;
}

static void child(const char *arg, int rank, int size, int appnum, char *jobid)
{
    char val[PMI2_MAX_VALLEN], key[64], want[PMI2_MAX_VALLEN + 64], cwd[4096];
    int len, n = nchildren();
    const char *wdir = getenv("SPAWN_WDIR");

    who = "child";
    if (getenv("SPAWN_MODE") && rank == 0) {
        if (strcmp(getenv("SPAWN_MODE"), "childfail") == 0)
            exit(7);
        if (strcmp(getenv("SPAWN_MODE"), "childabort") == 0)
            PMI2_Abort(1, "child gives up");
    }
    if (!getenv("PMI_SPAWNED") || strcmp(getenv("PMI_SPAWNED"), "1") != 0)
        die("PMI_SPAWNED is %s, want 1", getenv("PMI_SPAWNED") ? getenv("PMI_SPAWNED") : "unset");
    if (size != n + 1)
        die("size %d, want %d", size, n + 1);
    if (appnum != (rank < n ? 0 : 1) || strcmp(arg, appnum == 0 ? "A" : "B") != 0)
        die("appnum %d with argument %s", appnum, arg);
    if (PMI2_KVS_Get(jobid, PMI2_ID_NULL, "PARENT_KEY", val, sizeof val, &len) != PMI2_SUCCESS)
        die("pre-put key PARENT_KEY not found before the first fence");
    if (strncmp(val, "from-", 5) != 0 || strcmp(val + 5, jobid) == 0)
        die("PARENT_KEY = %s (own job %s)", val, jobid);
    if (wdir && appnum == 0) {
        if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, wdir) != 0)
            die("working directory %s, want %s", cwd, wdir);
    }
    snprintf(key, sizeof key, "ck-%d", rank);
    snprintf(want, sizeof want, "cv-%d-%s", rank, arg);
    if (PMI2_KVS_Put(key, want) != PMI2_SUCCESS || PMI2_KVS_Fence() != PMI2_SUCCESS)
        die("put/fence");
    for (int r = 0; r < size; r++) {
        char v[PMI2_MAX_VALLEN];
        snprintf(key, sizeof key, "ck-%d", r);
        snprintf(want, sizeof want, "cv-%d-%s", r, r < n ? "A" : "B");
        if (PMI2_KVS_Get(jobid, r, key, v, sizeof v, &len) != PMI2_SUCCESS || strcmp(v, want) != 0)
            die("get %s: %s, want %s", key, v, want);
    }
    snprintf(key, sizeof key, "child-%d", rank);
    snprintf(want, sizeof want, "%d:%s:%s", appnum, arg, val);
    if (PMI2_Nameserv_publish(key, NULL, want) != PMI2_SUCCESS)
        die("publish %s", key);
    printf("child ok rank %d size %d appnum %d\n", rank, size, appnum);
}

static void parent(const char *self, int rank, char *jobid)
{
    const char *mode = getenv("SPAWN_MODE") ? getenv("SPAWN_MODE") : "";
    int n = nchildren(), badwdir = strcmp(mode, "badwdir") == 0, missing = badwdir || strcmp(mode, "missing") == 0;
    const char *cmds[2] = {self, self};
    const char *argsA[] = {"child", "A"}, *argsB[] = {"child", "B"};
    const char **argvs[2] = {argsA, argsB};
    int argcs[2] = {2, 2}, maxprocs[2] = {n, 1};
    MPID_Info infoA[2], infoB[1], pre;
    const MPID_Info *infos[2] = {infoA, infoB}, *preput[1] = {&pre};
    int ninfo[2] = {0, 1};
    char prevalue[300], newjob[PMI2_MAX_VALLEN] = "";
    int errors[64];

    who = "parent";
    if (getenv("PMI_SPAWNED"))
        die("PMI_SPAWNED set in the parent job");
    if (rank != 0) {
        printf("parent ok rank %d\n", rank);
        return;
    }
    memset(infoA, 0, sizeof infoA);
    memset(infoB, 0, sizeof infoB);
    memset(&pre, 0, sizeof pre);
    infoA[ninfo[0]].key = "fastpmi-test-unknown-key";
    infoA[ninfo[0]++].value = "ignored";
    if (getenv("SPAWN_WDIR") || badwdir) {
        infoA[ninfo[0]].key = "wdir";
        infoA[ninfo[0]++].value = badwdir ? "/fastpmi-no-such-dir" : getenv("SPAWN_WDIR");
    }
    infoB[0].key = "path";
    infoB[0].value = "/usr/bin:/bin";
    snprintf(prevalue, sizeof prevalue, "from-%s", jobid);
    pre.key = "PARENT_KEY";
    pre.value = prevalue;
    if (missing) {
        if (!badwdir)
            cmds[0] = "./fastpmi-no-such-program";
        if (PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, ninfo, infos, 1, preput,
                           newjob, sizeof newjob, errors) == PMI2_SUCCESS)
            die("spawn of a missing program succeeded (job %s)", newjob);
        printf("parent ok rank 0 spawn refused\n");
        return;
    }
    if (PMI2_Job_Spawn(2, cmds, argcs, argvs, maxprocs, ninfo, infos, 1, preput,
                       newjob, sizeof newjob, errors) != PMI2_SUCCESS)
        die("PMI2_Job_Spawn failed");
    if (newjob[0] == 0 || strcmp(newjob, jobid) == 0)
        die("spawned job id %s (own %s)", newjob, jobid);
    for (int r = 0; r <= n; r++) {
        char name[64], port[PMI2_MAX_VALLEN], want[400];
        int tries = 0;
        snprintf(name, sizeof name, "child-%d", r);
        while (PMI2_Nameserv_lookup(name, NULL, port, sizeof port) != PMI2_SUCCESS) {
            if (++tries > 2000)
                die("child %d never published %s", r, name);
            usleep(10000);
        }
        snprintf(want, sizeof want, "%d:%s:%s", r < n ? 0 : 1, r < n ? "A" : "B", prevalue);
        if (strcmp(port, want) != 0)
            die("%s = %s, want %s", name, port, want);
    }
    printf("parent ok rank 0 children %d jobid %s\n", n + 1, newjob);
}

int main(int argc, char **argv)
{
    int spawned, size, rank, appnum;
    char jobid[256];

    signal(SIGALRM, on_alarm);
    alarm(60);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS)
        die("PMI2_Init failed");
    me = rank;
    if (PMI2_Job_GetId(jobid, sizeof jobid) != PMI2_SUCCESS)
        die("PMI2_Job_GetId failed");
    if (spawned) {
        if (argc < 3 || strcmp(argv[1], "child") != 0)
            die("spawned without the child arguments");
        child(argv[2], rank, size, appnum, jobid);
    } else {
        parent(argv[0], rank, jobid);
    }
    if (PMI2_Finalize() != PMI2_SUCCESS)
        die("PMI2_Finalize failed");
    return 0;
}
