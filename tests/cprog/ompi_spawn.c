/* ompi_spawn: MPI_Comm_spawn and MPI_Comm_spawn_multiple under Open MPI
 * (PMIx: the launcher's spawn, publish/lookup with wait, connect).
 *
 *   ompi_spawn N [ROUNDS [multiple]]
 *
 * The parent job spawns N copies of this program ROUNDS times, one after
 * the other; with "multiple", each round is one MPI_Comm_spawn_multiple
 * of two commands (1 and N-1 copies, application numbers 0 and 1). Each
 * child checks its world (size N, its MPI_APPNUM, an allreduce of the
 * ranks) and sends rank, world size and appnum to the parent's rank 0
 * over the intercommunicator; rank 0 checks every answer and prints
 *
 *   round R: N children answered, appnums A0 A1
 *
 * Both sides then disconnect. Any check that fails prints "FAIL ..." and
 * aborts with code 3.
 *
 *   ompi_spawn missing
 *
 * spawns a program that does not exist, with MPI_ERRORS_RETURN, prints
 * "rank R: spawn rc=RC" and finalizes (Open MPI 4.1's other ranks wait in
 * the spawn for ever: the launcher must end the job). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what, int a, int b)
{
    fprintf(stderr, "FAIL %s: %d, want %d\n", what, a, b);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static int child(MPI_Comm parent, int want_app)
{
    int rank, size, flag, *appnum = NULL, sum = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    if (!flag)
        fail("child has MPI_APPNUM", 0, 1);
    if (*appnum != want_app)
        fail("child appnum", *appnum, want_app);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size * (size - 1) / 2)
        fail("children's allreduce", sum, size * (size - 1) / 2);
    int msg[3] = {rank, size, *appnum};
    MPI_Send(msg, 3, MPI_INT, 0, 7, parent);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL)
        return child(parent, argc > 2 ? atoi(argv[2]) : 0);
    if (argc > 1 && strcmp(argv[1], "missing") == 0) {
        int rank, err;
        MPI_Comm inter;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int rc = MPI_Comm_spawn("/nonexistent/fastpmi-missing", MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD,
                                &inter, &err);
        printf("rank %d: spawn rc=%d\n", rank, rc);
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }

    int n = argc > 1 ? atoi(argv[1]) : 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 1;
    int multiple = argc > 3 && strcmp(argv[3], "multiple") == 0;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (n < 1 || (multiple && n < 2))
        fail("children", n, multiple ? 2 : 1);
    int *errs = calloc((size_t)n, sizeof(int));
    for (int r = 0; r < rounds; r++) {
        MPI_Comm inter;
        int rc;
        if (multiple) {
            char *cmds[2] = {argv[0], argv[0]};
            char *a0[] = {"child", "0", NULL}, *a1[] = {"child", "1", NULL};
            char **argvs[2] = {a0, a1};
            int procs[2] = {1, n - 1};
            MPI_Info infos[2] = {MPI_INFO_NULL, MPI_INFO_NULL};
            rc = MPI_Comm_spawn_multiple(2, cmds, argvs, procs, infos, 0, MPI_COMM_WORLD, &inter, errs);
        } else {
            char *a[] = {"child", "0", NULL};
            rc = MPI_Comm_spawn(argv[0], a, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errs);
        }
        if (rc != MPI_SUCCESS)
            fail("MPI_Comm_spawn", rc, MPI_SUCCESS);
        for (int i = 0; i < n; i++)
            if (errs[i] != MPI_SUCCESS)
                fail("spawn error code", errs[i], MPI_SUCCESS);
        int remote;
        MPI_Comm_remote_size(inter, &remote);
        if (remote != n)
            fail("remote group size", remote, n);
        if (rank == 0) {
            int apps[2] = {0, 0};
            for (int i = 0; i < n; i++) {
                int msg[3];
                MPI_Status st;
                MPI_Recv(msg, 3, MPI_INT, MPI_ANY_SOURCE, 7, inter, &st);
                if (msg[0] != st.MPI_SOURCE)
                    fail("child's rank", msg[0], st.MPI_SOURCE);
                if (msg[1] != n)
                    fail("child's world size", msg[1], n);
                int want = multiple && msg[0] > 0 ? 1 : 0;
                if (msg[2] != want)
                    fail("child's appnum", msg[2], want);
                apps[msg[2]]++;
            }
            printf("round %d: %d children answered, appnums %d %d\n", r, n, apps[0], apps[1]);
            fflush(stdout);
        }
        MPI_Comm_disconnect(&inter);
    }
    free(errs);
    MPI_Finalize();
    return 0;
}
