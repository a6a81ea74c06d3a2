/* ompi_die: an Open MPI (PMIx) rank that dies on purpose. argv[1] says
 * when, argv[2] which rank (default 1):
 *   before-init  the rank kills itself (SIGKILL) before MPI_Init, while
 *                the others wait in MPI_Init's PMIx fence for it;
 *   in-fence     the rank kills itself after MPI_Init, while the others
 *                wait in MPI_Finalize's PMIx fence for it.
 * The launcher must end the job naming the rank. A rank still alive after
 * 60 s says so on stderr and exits 1. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(void)
{
    fflush(stdout);
    raise(SIGKILL);
}

int main(int argc, char **argv)
{
    const char *when = argc > 1 ? argv[1] : "before-init";
    int victim = argc > 2 ? atoi(argv[2]) : 1;
    const char *env = getenv("PMIX_RANK");
    int me = env != NULL ? atoi(env) : -1;

    if (strcmp(when, "before-init") != 0 && strcmp(when, "in-fence") != 0) {
        fprintf(stderr, "ompi_die: want before-init or in-fence, not %s\n", when);
        return 2;
    }
    alarm(60); /* a rank left waiting ends itself: SIGALRM, "still waiting" below never prints */
    if (me == victim && strcmp(when, "before-init") == 0)
        die();
    MPI_Init(&argc, &argv);
    if (me == victim)
        die();
    MPI_Finalize();
    fprintf(stderr, "ompi_die: rank %d finalized although rank %d died\n", me, victim);
    return 1;
}
