/* dgemm harness: deterministic A and B, C = A*B checked on every execution
 * against a plain-C reference computed once, one MTSWARM_RESULT line per
 * execution. */
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

static void reference(const double *a, const double *b, double *c) {
    for (long i = 0; i < M; i++) {
        for (long j = 0; j < N; j++) c[i * N + j] = 0.0;
        for (long k = 0; k < K; k++) {
            double aik = a[i * K + k];
            for (long j = 0; j < N; j++) c[i * N + j] += aik * b[k * N + j];
        }
    }
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
    double *ref = malloc((size_t)M * N * sizeof(double));
    if (!a || !b || !c || !ref) {
        fprintf(stderr, "dgemm: out of memory\n");
        return 1;
    }
    for (long i = 0; i < (long)M * K; i++) a[i] = (double)((i * 7 + 3) % 17) / 16.0 - 0.5;
    for (long i = 0; i < (long)K * N; i++) b[i] = (double)((i * 11 + 5) % 13) / 12.0 - 0.5;
    reference(a, b, ref);
    int barrier = hthread_barrier_create(cluster);
    double flops = 2.0 * M * N * K;
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        for (long i = 0; i < (long)M * N; i++) c[i] = NAN;
        uint64_t args[4] = {(uint64_t)barrier, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        int g = hthread_group_create(cluster, cores, "dgemm_kernel", 1, 3, args);
        if (g < 0) {
            mtswarm_report(0, NAN, flops, "hthread_group_create failed");
            return 1;
        }
        mtswarm_exec_and_wait(g);
        hthread_group_destroy(g);
        double max_err = 0.0;
        for (long i = 0; i < (long)M * N; i++) {
            double err = fabs(c[i] - ref[i]);
            if (!(err <= max_err)) max_err = err; /* NaN counts as a failure */
        }
        int valid = max_err <= TOLERANCE;
        char msg[128];
        snprintf(msg, sizeof msg, "max_abs_err %.3e exceeds tolerance %.1e", max_err, (double)TOLERANCE);
        mtswarm_report(valid, max_err, flops, valid ? NULL : msg);
        failed |= !valid;
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    free(ref);
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
    return failed ? 1 : 0;
}
