/* mpi_abort: after MPI_Init, the rank given by argv[1] (default 1; the last
 * rank if the job is smaller) calls MPI_Abort(MPI_COMM_WORLD, argv[2],
 * default 7). Built with MPICH and, as ompi_abort, with Open MPI. Every
 * other rank prints "waiting rank R" and sleeps: the launcher must kill it.
 * A rank still alive after 60 s says so on stderr and exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size;
    int victim = argc > 1 ? atoi(argv[1]) : 1;
    int code = argc > 2 ? atoi(argv[2]) : 7;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (victim >= size)
        victim = size - 1;

    if (rank == victim) {
        fprintf(stderr, "mpi_abort: rank %d calls MPI_Abort(%d)\n", rank, code);
        MPI_Abort(MPI_COMM_WORLD, code);
        fprintf(stderr, "mpi_abort: rank %d: MPI_Abort returned\n", rank);
        return 1;
    }
    printf("waiting rank %d\n", rank);
    fflush(stdout);
    for (int i = 0; i < 600; i++)
        usleep(100 * 1000);
    fprintf(stderr, "mpi_abort: rank %d was not killed after rank %d aborted\n", rank, victim);
    return 1;
}
