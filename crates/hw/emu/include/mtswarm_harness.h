/* Helpers for host harnesses (examples/kernels/<name>/host.c): argument
 * parsing, opening the cluster, core selection, launching an execution,
 * comparing its output and the MTSWARM_RESULT line. Plain C with no
 * emulator dependency, so a harness builds for the board as well. They
 * live here, on the toolchain's include path, rather than in each kernel
 * directory: what checks a kernel is never the kernel's to change.
 *
 * Protocol: one line per kernel execution on stdout,
 *   MTSWARM_TIME {"seconds":0.0123}     (wall clock of group_exec..group_wait)
 *   MTSWARM_RESULT {"valid":true,"max_abs_err":1e-13,"flops":268435456,"error":null,"seed":7}
 *
 * Inputs change every execution: a harness calls mtswarm_execution_seed(run)
 * before each execution and draws that execution's inputs from the seed
 * (mtswarm_uniform), so an answer remembered from an earlier execution or
 * launch fails validation. The launch's base seed comes from $MTSWARM_SEED
 * (a fresh value per launch, set by mtswarm), else from the clock; each
 * execution's seed is reported in its MTSWARM_RESULT line.
 * The emulator's runtime adds its modeled MTSWARM_EMU lines; on a board the
 * MTSWARM_TIME line is the measurement.
 */
#ifndef MTSWARM_HARNESS_H
#define MTSWARM_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "hthread_host.h"

/* The seed of the current execution (0 before mtswarm_execution_seed). */
static uint64_t mtswarm_seed_current_;
static int mtswarm_seed_drawn_;

/* splitmix64: the next pseudo-random 64-bit value of `state`. */
static inline uint64_t mtswarm_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform double in [lo, hi) from `state`. */
static inline double mtswarm_uniform(uint64_t *state, double lo, double hi) {
    return lo + (hi - lo) * (double)(mtswarm_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* The base seed of this launch. */
static inline uint64_t mtswarm_launch_seed(void) {
    const char *s = getenv("MTSWARM_SEED");
    if (s && *s) {
        char *end = NULL;
        unsigned long long v = strtoull(s, &end, 10);
        if (end != s && *end == '\0') return (uint64_t)v;
    }
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
#if defined(__wasi__)
    return (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 20);
#else
    return (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
#endif
}

/* The seed of execution `run` of this launch: draw its inputs from it. */
static inline uint64_t mtswarm_execution_seed(int run) {
    static uint64_t base;
    static int have_base;
    if (!have_base) {
        base = mtswarm_launch_seed();
        have_base = 1;
    }
    uint64_t state = base ^ ((uint64_t)run * 0xD1B54A32D192ED03ull);
    mtswarm_seed_current_ = mtswarm_next(&state);
    mtswarm_seed_drawn_ = 1;
    return mtswarm_seed_current_;
}

/* A seed for the checks of an execution, drawn after its kernel ran from
 * the system's randomness (which device code has no way to observe). */
static inline uint64_t mtswarm_check_seed(void) {
    uint64_t v = 0;
    if (getentropy(&v, sizeof v) != 0) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        v = (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 30) ^ mtswarm_seed_current_;
    }
    return v;
}

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
    if (mtswarm_seed_drawn_) printf(",\"seed\":%llu", (unsigned long long)mtswarm_seed_current_);
    fputs("}\n", stdout);
    fflush(stdout);
}

/* Open the launch's cluster (mtswarm_cluster) and load the kernel
 * (kernel.dat) onto it; a harness that cannot exits with status 1, naming
 * itself (`harness`). Returns the cluster. */
static inline int mtswarm_open(const char *harness) {
    int cluster = mtswarm_cluster();
    if (hthread_dev_open(cluster) != 0 || hthread_dat_load(cluster, "kernel.dat") != 0) {
        fprintf(stderr, "%s: cannot open cluster %d\n", harness, cluster);
        exit(1);
    }
    return cluster;
}

/* Unload the kernel and close the cluster mtswarm_open opened. */
static inline void mtswarm_close(int cluster) {
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
}

/* Run one execution: the __global__ function `kernel` on `cores` cores of
 * `cluster`, with `nscalar` scalar then `nptr` pointer arguments `args`,
 * timed by mtswarm_exec_and_wait. A group that cannot be created is
 * reported as an invalid execution of `flops` and returns -1; else 0. */
static inline int mtswarm_launch(int cluster, int cores, const char *kernel, int nscalar, int nptr,
                                 uint64_t *args, double flops) {
    int group = hthread_group_create(cluster, cores, kernel, nscalar, nptr, args);
    if (group < 0) {
        mtswarm_report(0, NAN, flops, "hthread_group_create failed");
        return -1;
    }
    mtswarm_exec_and_wait(group);
    hthread_group_destroy(group);
    return 0;
}

/* max_i |got[i] - want[i]| over `n` elements; NaN when any difference is
 * NaN (an element left unwritten as NaN fails wherever it stands). */
static inline double mtswarm_max_abs_diff(const double *got, const double *want, size_t n) {
    double max_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]);
        if (isnan(err)) return NAN;
        if (err > max_err) max_err = err;
    }
    return max_err;
}

/* Report an execution of `flops` whose largest error is `max_err`: valid
 * when it is within `tolerance` (NaN never is). Returns whether it was. */
static inline int mtswarm_report_within(double max_err, double tolerance, double flops) {
    int valid = max_err <= tolerance;
    char msg[128];
    snprintf(msg, sizeof msg, "max_abs_err %.3e exceeds tolerance %.1e", max_err, tolerance);
    mtswarm_report(valid, max_err, flops, valid ? NULL : msg);
    return valid;
}

#endif
