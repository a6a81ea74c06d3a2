/* mpi_hello: the smallest MPI program, the start-up benchmark workload
 * (built with MPICH, and with Open MPI as ompi_hello).
 * Silent unless FASTPMI_HELLO_VERBOSE is set, then it prints
 * "hello from rank R of N". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size;

    MPI_Init(&argc, &argv);
    if (getenv("FASTPMI_HELLO_VERBOSE") != NULL) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        printf("hello from rank %d of %d\n", rank, size);
    }
    MPI_Finalize();
    return 0;
}
