/* shm_storm: an e2e test rank that wakes its node agent without end, as a
 * buggy (or hostile) rank with a runaway loop would, and measures what
 * that costs the agent.
 *
 *   shm_storm MODE SECONDS
 *
 * Local rank 0 maps the node's segment (FASTPMI_SHM_FD) and for SECONDS
 * seconds, in a tight loop and without ever pushing a request:
 *
 *   ready      stores all ones into the first ready-bitmap word (the
 *              marks of ranks that committed a request)
 *   doorbell   bumps the agent's doorbell word and wakes it (FUTEX_WAKE)
 *
 * It reads its parent's CPU time (the agent: pmirun on one node, pmid
 * else) from /proc before and after, prints "agent cpu ms N of M" to
 * stdout and exits 0 without PMI: the job fails, which the test expects.
 * The other local ranks sleep SECONDS + 1 seconds and exit 0. The offsets
 * are the layout's (shm/layout.go): the header's control-region offset
 * and local rank count, control blocks of 256 bytes, then the ready
 * words; the doorbell word at 128. */
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* cpu_ms returns pid's user + system CPU time in milliseconds, or -1. */
static long cpu_ms(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces */
    if (!p)
        return -1;
    unsigned long ut, st;
    /* after ")": state, then fields 4..13, then utime (14), stime (15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)((ut + st) * 1000 / sysconf(_SC_CLK_TCK));
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: shm_storm ready|doorbell SECONDS\n");
        return 2;
    }
    const char *mode = argv[1];
    double secs = atof(argv[2]);
    const char *lr = getenv("MPI_LOCALRANKID"), *fds = getenv("FASTPMI_SHM_FD");
    if (!lr || !fds) {
        fprintf(stderr, "shm_storm: no MPI_LOCALRANKID or FASTPMI_SHM_FD\n");
        return 1;
    }
    if (atoi(lr) != 0) {
        usleep((useconds_t)((secs + 1) * 1e6));
        return 0;
    }
    int fd = atoi(fds);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        perror("shm_storm: fstat");
        return 1;
    }
    unsigned char *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("shm_storm: mmap");
        return 1;
    }
    uint64_t ctrl;
    uint32_t local;
    memcpy(&ctrl, m + 56, 8);
    memcpy(&local, m + 24, 4);
    uint64_t *ready = (uint64_t *)(m + ctrl + (uint64_t)local * 256);
    uint32_t *doorbell = (uint32_t *)(m + 128);
    pid_t agent = getppid();
    long c0 = cpu_ms(agent);
    double t0 = now(), end = t0 + secs;
    if (strcmp(mode, "ready") == 0) {
        while (now() < end)
            for (int i = 0; i < 1000; i++)
                __atomic_store_n(ready, ~(uint64_t)0, __ATOMIC_SEQ_CST);
    } else if (strcmp(mode, "doorbell") == 0) {
        while (now() < end) {
            __atomic_add_fetch(doorbell, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        }
    } else {
        fprintf(stderr, "shm_storm: unknown mode %s\n", mode);
        return 2;
    }
    long c1 = cpu_ms(agent);
    printf("agent cpu ms %ld of %ld\n", c1 - c0, (long)((now() - t0) * 1000));
    return 0;
}
