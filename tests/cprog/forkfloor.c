/* forkfloor: the fork+exec floor of a launcher. Usage:
 *
 *     forkfloor -n N PROG [ARGS...]
 *
 * starts N copies of PROG with posix_spawn (glibc's vfork-style clone:
 * the parent waits only for each child's exec, as Go's os/exec does),
 * each with PMI_RANK set, waits for all of them,
 * and exits 0 if every copy exited 0 (else 1, naming the first failure).
 * It serves no PMI: time it with a program that needs none (true_static),
 * against "pmirun -n N PROG" on the same program, and the difference is
 * what a launcher adds to bare process start-up. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[1], "-n") != 0) {
        fprintf(stderr, "usage: forkfloor -n N PROG [ARGS...]\n");
        return 2;
    }
    char *end;
    long n = strtol(argv[2], &end, 10);
    if (*end != '\0' || n < 1 || n > 1 << 20) {
        fprintf(stderr, "forkfloor: bad rank count %s\n", argv[2]);
        return 2;
    }
    for (long r = 0; r < n; r++) {
        char rank[32];
        snprintf(rank, sizeof rank, "%ld", r);
        setenv("PMI_RANK", rank, 1);
        pid_t pid;
        int err = posix_spawn(&pid, argv[3], NULL, NULL, argv + 3, environ);
        if (err != 0) {
            fprintf(stderr, "forkfloor: start rank %ld (%s): %s\n", r, argv[3], strerror(err));
            return 1;
        }
    }
    int failed = 0;
    for (long r = 0; r < n; r++) {
        int st;
        pid_t pid = wait(&st);
        if (pid < 0) {
            fprintf(stderr, "forkfloor: wait: %s\n", strerror(errno));
            return 1;
        }
        if (!failed && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
            fprintf(stderr, "forkfloor: process %d ended with status %#x\n", (int)pid, st);
            failed = 1;
        }
    }
    return failed;
}
