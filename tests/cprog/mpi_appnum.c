/* mpi_appnum: every rank of an MPMD job prints its MPI_APPNUM and its
 * first argument, then the ranks check with an allreduce that they all
 * run in one MPI_COMM_WORLD:
 *   "appnum rank R size S appnum A arg X sum T"
 * T is the sum of every rank's appnum. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, flag, *app = NULL, mine, sum = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &app, &flag);
    mine = flag ? *app : -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("appnum rank %d size %d appnum %d arg %s sum %d\n", rank, size, mine, argc > 1 ? argv[1] : "-", sum);
    MPI_Finalize();
    return 0;
}
