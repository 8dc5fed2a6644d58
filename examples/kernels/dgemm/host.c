/* dgemm harness: A and B drawn from each execution's seed, C = A*B checked
 * on every execution, one MTSWARM_RESULT line per execution.
 *
 * The check is Freivalds' projection: C x against A (B x) for a random x
 * with entries in [0.5, 1.5), drawn after the kernel ran from randomness it
 * cannot observe (mtswarm_check_seed), in O(n^2) instead of the O(n^3) reference, so
 * fresh inputs every execution cost no more than the kernel's own
 * emulation. A wrong element c_ij shows as an error of at least half its
 * own in row i; max_abs_err is the largest row error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#ifndef M
#define M 512
#endif
#ifndef N
#define N 512
#endif
#ifndef K
#define K 512
#endif
#ifndef TOLERANCE
#define TOLERANCE 1e-9
#endif

/* max_i |(C x)_i - (A (B x))_i|; NaN anywhere gives NaN. */
static double projection_error(const double *a, const double *b, const double *c, const double *x,
                               double *bx) {
    for (long k = 0; k < K; k++) {
        double s = 0.0;
        for (long j = 0; j < N; j++) s += b[k * N + j] * x[j];
        bx[k] = s;
    }
    double max_err = 0.0;
    for (long i = 0; i < M; i++) {
        double want = 0.0, got = 0.0;
        for (long k = 0; k < K; k++) want += a[i * K + k] * bx[k];
        for (long j = 0; j < N; j++) got += c[i * N + j] * x[j];
        double err = fabs(got - want);
        if (isnan(err)) return NAN;
        if (err > max_err) max_err = err;
    }
    return max_err;
}

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_cluster();
    if (hthread_dev_open(cluster) != 0 || hthread_dat_load(cluster, "kernel.dat") != 0) {
        fprintf(stderr, "dgemm: cannot open cluster %d\n", cluster);
        return 1;
    }
    int cores = mtswarm_cores(cluster);
    double *a = hthread_malloc(cluster, (size_t)M * K * sizeof(double), HT_MEM_RO);
    double *b = hthread_malloc(cluster, (size_t)K * N * sizeof(double), HT_MEM_RO);
    double *c = hthread_malloc(cluster, (size_t)M * N * sizeof(double), HT_MEM_RW);
    double *x = malloc((size_t)N * sizeof(double));
    double *bx = malloc((size_t)K * sizeof(double));
    if (!a || !b || !c || !x || !bx) {
        fprintf(stderr, "dgemm: out of memory\n");
        return 1;
    }
    int barrier = hthread_barrier_create(cluster);
    double flops = 2.0 * M * N * K;
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (long i = 0; i < (long)M * K; i++) a[i] = mtswarm_uniform(&state, -0.5, 0.5);
        for (long i = 0; i < (long)K * N; i++) b[i] = mtswarm_uniform(&state, -0.5, 0.5);
        for (long i = 0; i < (long)M * N; i++) c[i] = NAN;
        uint64_t args[4] = {(uint64_t)barrier, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        int g = hthread_group_create(cluster, cores, "dgemm_kernel", 1, 3, args);
        if (g < 0) {
            mtswarm_report(0, NAN, flops, "hthread_group_create failed");
            return 1;
        }
        mtswarm_exec_and_wait(g);
        hthread_group_destroy(g);
        /* The check vector is drawn now, from randomness the kernel cannot
         * observe: one drawn with the inputs could be predicted from them. */
        uint64_t check = mtswarm_check_seed();
        for (long j = 0; j < N; j++) x[j] = mtswarm_uniform(&check, 0.5, 1.5);
        double max_err = projection_error(a, b, c, x, bx); /* NaN counts as a failure */
        int valid = max_err <= TOLERANCE;
        char msg[128];
        snprintf(msg, sizeof msg, "max_abs_err %.3e exceeds tolerance %.1e", max_err, (double)TOLERANCE);
        mtswarm_report(valid, max_err, flops, valid ? NULL : msg);
        failed |= !valid;
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    free(x);
    free(bx);
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
    return failed ? 1 : 0;
}
