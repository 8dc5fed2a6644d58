/* vecadd harness: fresh inputs drawn from each execution's seed, every
 * execution checked against a plain-C reference, one MTSWARM_RESULT line per
 * execution. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#ifndef N
#define N (1 << 20)
#endif
#ifndef TOLERANCE
#define TOLERANCE 0.0
#endif

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_cluster();
    if (hthread_dev_open(cluster) != 0 || hthread_dat_load(cluster, "kernel.dat") != 0) {
        fprintf(stderr, "vecadd: cannot open cluster %d\n", cluster);
        return 1;
    }
    int cores = mtswarm_cores(cluster);
    uint64_t n = N;
    double *a = hthread_malloc(cluster, n * sizeof(double), HT_MEM_RO);
    double *b = hthread_malloc(cluster, n * sizeof(double), HT_MEM_RO);
    double *c = hthread_malloc(cluster, n * sizeof(double), HT_MEM_WO);
    if (!a || !b || !c) {
        fprintf(stderr, "vecadd: hthread_malloc failed\n");
        return 1;
    }
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (uint64_t i = 0; i < n; i++) {
            a[i] = mtswarm_uniform(&state, -1.0, 1.0);
            b[i] = mtswarm_uniform(&state, -1.0, 1.0);
            c[i] = -1.0;
        }
        uint64_t args[5] = {n, (uint64_t)run, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        int g = hthread_group_create(cluster, cores, "vecadd_kernel", 2, 3, args);
        if (g < 0) {
            mtswarm_report(0, NAN, (double)n, "hthread_group_create failed");
            return 1;
        }
        mtswarm_exec_and_wait(g);
        hthread_group_destroy(g);
        double max_err = 0.0;
        for (uint64_t i = 0; i < n; i++) {
            double err = fabs(c[i] - (a[i] + b[i]));
            if (!(err <= max_err)) max_err = err;
        }
        int valid = max_err <= TOLERANCE;
        char msg[128];
        snprintf(msg, sizeof msg, "max_abs_err %.3e exceeds tolerance %.1e", max_err, (double)TOLERANCE);
        mtswarm_report(valid, max_err, (double)n, valid ? NULL : msg);
        failed |= !valid;
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
    return failed ? 1 : 0;
}
