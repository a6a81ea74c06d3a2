/* mpi_args: prints its arguments, each in brackets, on one line per rank:
 *
 *   rank R: [a b] [c  d] []
 *
 * and, if EXPECT_ARGS is set, checks them inside the rank: EXPECT_ARGS is
 * the expected argv[1..] with every argument followed by the unit
 * separator 0x1f (so "" means no arguments and "\x1f" one empty one).
 * The arguments are copied before MPI_Init, which may rewrite argv. A
 * mismatch goes to stderr and the rank exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEP '\x1f'

int main(int argc, char **argv)
{
    int rank, size, bad = 0;
    int nargs = argc;
    char **args = calloc(nargs + 1, sizeof *args);

    for (int i = 0; i < nargs; i++)
        args[i] = strdup(argv[i]);

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    const char *expect = getenv("EXPECT_ARGS");
    if (expect != NULL) {
        int i = 1;
        const char *p = expect;
        while (*p != '\0') {
            const char *end = strchr(p, SEP);
            if (end == NULL) {
                fprintf(stderr, "mpi_args: rank %d: EXPECT_ARGS does not end with 0x1f\n", rank);
                return 2;
            }
            size_t n = end - p;
            if (i >= nargs) {
                fprintf(stderr, "mpi_args: rank %d: argument %d missing, want [%.*s]\n", rank, i, (int)n, p);
                bad = 1;
            } else if (strlen(args[i]) != n || memcmp(args[i], p, n) != 0) {
                fprintf(stderr, "mpi_args: rank %d: argument %d is [%s], want [%.*s]\n", rank, i, args[i], (int)n, p);
                bad = 1;
            }
            i++;
            p = end + 1;
        }
        if (i < nargs) {
            fprintf(stderr, "mpi_args: rank %d: %d arguments, want %d\n", rank, nargs - 1, i - 1);
            bad = 1;
        }
    }

    /* One write per line, so the launcher sees the whole line at once. */
    size_t len = 64;
    for (int i = 1; i < nargs; i++)
        len += strlen(args[i]) + 3;
    char *line = malloc(len);
    int off = snprintf(line, len, "rank %d:", rank);
    for (int i = 1; i < nargs; i++)
        off += snprintf(line + off, len - off, " [%s]", args[i]);
    printf("%s\n", line);
    fflush(stdout);

    MPI_Finalize();
    return bad;
}
