/* mpi_allreduce: every rank contributes rank+1 to an MPI_Allreduce(SUM) and
 * checks the result against N(N+1)/2, then all meet in an MPI_Barrier.
 * Built with MPICH (PMI-1) and, as ompi_allreduce, with Open MPI (PMIx):
 * the rank's PMI_SIZE and, when set, PMIX_RANK must agree with MPI.
 *
 * Output: every rank prints "ok rank R of N"; rank 0 also prints
 * "allreduce ok N=<n> sum=<s>". Any mismatch is reported on stderr and the
 * rank exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank = -1, size = -1;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    const char *env_size = getenv("PMI_SIZE");
    if (env_size != NULL && atoi(env_size) != size) {
        fprintf(stderr, "mpi_allreduce: rank %d: MPI size %d but PMI_SIZE=%s\n", rank, size, env_size);
        return 1;
    }

    const char *env_rank = getenv("PMIX_RANK");
    if (env_rank != NULL && atoi(env_rank) != rank) {
        fprintf(stderr, "mpi_allreduce: rank %d: PMIX_RANK=%s\n", rank, env_rank);
        return 1;
    }

    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size + 1) / 2;
    if (sum != want) {
        fprintf(stderr, "mpi_allreduce: rank %d of %d: sum %ld, want %ld\n", rank, size, sum, want);
        return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);

    printf("ok rank %d of %d\n", rank, size);
    if (rank == 0)
        printf("allreduce ok N=%d sum=%ld\n", size, sum);
    fflush(stdout);

    MPI_Finalize();
    return 0;
}
