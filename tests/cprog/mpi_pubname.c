/* mpi_pubname: the name service through the launcher (PMI-1
 * publish_name / lookup_name / unpublish_name), without MPI_Open_port.
 *
 *   rank 0   MPI_Publish_name("fastpmi-svc", port)      barrier
 *   rank 1.. MPI_Lookup_name("fastpmi-svc") == port      barrier
 *   rank 0   MPI_Unpublish_name("fastpmi-svc", port)     barrier
 *   every rank: MPI_Lookup_name("fastpmi-svc") must fail
 *
 * The port string looks like an MPICH port ('#', '$', ':') and carries the
 * job size so a stale name from another job would not match. Prints
 * "pubname ok rank R"; a mismatch goes to stderr and exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char service[] = "fastpmi-svc";

static void fail(int rank, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0, class = 0;

    msg[0] = '\0';
    if (rc != MPI_SUCCESS) {
        MPI_Error_class(rc, &class);
        MPI_Error_string(rc, msg, &len);
    }
    fprintf(stderr, "mpi_pubname: rank %d: %s (rc=%d class=%d %s)\n", rank, what, rc, class, msg);
    exit(1);
}

int main(int argc, char **argv)
{
    int rank, size, rc;
    char port[MPI_MAX_PORT_NAME], got[MPI_MAX_PORT_NAME];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* Name-service errors are raised on no communicator in particular;
     * depending on the MPI version that means MPI_COMM_WORLD or
     * MPI_COMM_SELF. Make both return instead of aborting. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);

    snprintf(port, sizeof port, "port-string-tag#0$host#node:4242$size#%d$", size);

    if (rank == 0) {
        rc = MPI_Publish_name(service, MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS)
            fail(rank, "MPI_Publish_name failed", rc);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank != 0) {
        memset(got, 0, sizeof got);
        rc = MPI_Lookup_name(service, MPI_INFO_NULL, got);
        if (rc != MPI_SUCCESS)
            fail(rank, "MPI_Lookup_name of a published name failed", rc);
        if (strcmp(got, port) != 0) {
            fprintf(stderr, "mpi_pubname: rank %d: lookup got \"%s\", want \"%s\"\n", rank, got, port);
            return 1;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank == 0) {
        rc = MPI_Unpublish_name(service, MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS)
            fail(rank, "MPI_Unpublish_name failed", rc);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    got[0] = '\0';
    rc = MPI_Lookup_name(service, MPI_INFO_NULL, got);
    if (rc == MPI_SUCCESS) {
        fprintf(stderr, "mpi_pubname: rank %d: lookup after unpublish succeeded with \"%s\"\n", rank, got);
        return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);

    printf("pubname ok rank %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
