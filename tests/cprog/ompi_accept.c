/* ompi_accept: an MPI server and its client, launched as two jobs, that
 * find each other by name and connect (MPI_Open_port, MPI_Publish_name,
 * MPI_Comm_accept; MPI_Lookup_name, MPI_Comm_connect), then check the
 * joined communicator with an allreduce and disconnect.
 *
 *   ompi_accept server|client NAME
 *
 * Every rank prints "accept: ROLE rank R of N joined J: sum S" where J is
 * the joined size and S the sum of the joined ranks' world sizes plus
 * ranks; a failure goes to stderr and exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check(int rc, const char *what)
{
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "ompi_accept: %s: %s\n", what, msg);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0)) {
        fprintf(stderr, "usage: ompi_accept server|client NAME\n");
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm inter, joined;
    if (server) {
        if (rank == 0) {
            check(MPI_Open_port(MPI_INFO_NULL, port), "MPI_Open_port");
            check(MPI_Publish_name(argv[2], MPI_INFO_NULL, port), "MPI_Publish_name");
        }
        check(MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter), "MPI_Comm_accept");
    } else {
        if (rank == 0) {
            int rc = MPI_ERR_NAME;
            for (int i = 0; i < 600 && rc != MPI_SUCCESS; i++) {
                rc = MPI_Lookup_name(argv[2], MPI_INFO_NULL, port);
                if (rc != MPI_SUCCESS)
                    usleep(50000);
            }
            check(rc, "MPI_Lookup_name");
        }
        check(MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter), "MPI_Comm_connect");
    }
    check(MPI_Intercomm_merge(inter, !server, &joined), "MPI_Intercomm_merge");
    int jrank, jsize;
    MPI_Comm_rank(joined, &jrank);
    MPI_Comm_size(joined, &jsize);
    int mine = size * 1000 + jrank, sum = 0;
    check(MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, joined), "MPI_Allreduce");
    printf("accept: %s rank %d of %d joined %d: sum %d\n", argv[1], rank, size, jsize, sum);
    fflush(stdout);
    MPI_Comm_free(&joined);
    check(MPI_Comm_disconnect(&inter), "MPI_Comm_disconnect");
    if (server && rank == 0) {
        check(MPI_Unpublish_name(argv[2], MPI_INFO_NULL, port), "MPI_Unpublish_name");
        check(MPI_Close_port(port), "MPI_Close_port");
    }
    MPI_Finalize();
    return 0;
}
