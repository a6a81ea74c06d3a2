/* mpi_finexit: every rank calls MPI_Finalize; then the rank given by
 * argv[1] (default 1) returns the code argv[2] (default 3) at once, and
 * every other rank works on for 1 s, as a program writing its results
 * after finalize does, and prints "results rank R". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank;
    int who = argc > 1 ? atoi(argv[1]) : 1;
    int code = argc > 2 ? atoi(argv[2]) : 3;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Finalize();
    if (rank == who)
        return code;
    usleep(1000 * 1000);
    printf("results rank %d\n", rank);
    return 0;
}
