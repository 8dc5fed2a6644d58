/* Helpers for host harnesses (examples/kernels/<name>/host.c): argument
 * parsing, core selection and the MTSWARM_RESULT line. Plain C with no
 * emulator dependency, so a harness builds for the board as well.
 *
 * Protocol: one line per kernel execution on stdout,
 *   MTSWARM_TIME {"seconds":0.0123}     (wall clock of group_exec..group_wait)
 *   MTSWARM_RESULT {"valid":true,"max_abs_err":1e-13,"flops":268435456,"error":null}
 * The emulator's runtime adds its modeled MTSWARM_EMU lines; on a board the
 * MTSWARM_TIME line is the measurement.
 */
#ifndef MTSWARM_HARNESS_H
#define MTSWARM_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hthread_host.h"

/* `--runs N` (default 1): kernel executions in this process. */
static inline int mtswarm_parse_runs(int argc, char **argv) {
    int runs = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            char *end = NULL;
            long v = strtol(argv[i + 1], &end, 10);
            if (end == argv[i + 1] || *end != '\0' || v < 1 || v > 1000000) {
                fprintf(stderr, "harness: --runs needs a positive integer, got '%s'\n", argv[i + 1]);
                exit(2);
            }
            runs = (int)v;
            i++;
        } else {
            fprintf(stderr, "harness: unknown argument '%s' (expected --runs N)\n", argv[i]);
            exit(2);
        }
    }
    return runs;
}

/* The cluster to use: $MTSWARM_CLUSTER, default 0. */
static inline int mtswarm_cluster(void) {
    const char *s = getenv("MTSWARM_CLUSTER");
    return s ? atoi(s) : 0;
}

/* Cores to launch: the slice's cores, or -D CORES=n. Asking for more than
 * the cluster has is reported by hthread_group_create. */
static inline int mtswarm_cores(int cluster) {
#ifdef CORES
    (void)cluster;
    return CORES;
#else
    return hthread_get_avail_threads(cluster);
#endif
}

/* Monotonic wall clock, seconds. */
static inline double mtswarm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Launch a created group and wait for it, printing its wall-clock time. */
static inline void mtswarm_exec_and_wait(int group) {
    double start = mtswarm_now();
    hthread_group_exec(group);
    hthread_group_wait(group);
    printf("MTSWARM_TIME {\"seconds\":%.9e}\n", mtswarm_now() - start);
}

/* Print the result line of one execution. `error` may be NULL. */
static inline void mtswarm_report(int valid, double max_abs_err, double flops, const char *error) {
    printf("MTSWARM_RESULT {\"valid\":%s,\"max_abs_err\":", valid ? "true" : "false");
    if (isfinite(max_abs_err)) printf("%.6e", max_abs_err); else fputs("null", stdout);
    printf(",\"flops\":%.0f,\"error\":", flops);
    if (error) {
        putchar('"');
        for (const char *p = error; *p; p++) {
            if (*p == '"' || *p == '\\') putchar('\\');
            if ((unsigned char)*p >= 0x20) putchar(*p);
        }
        putchar('"');
    } else {
        fputs("null", stdout);
    }
    fputs("}\n", stdout);
    fflush(stdout);
}

#endif
