/* vecadd harness: fresh inputs drawn from each execution's seed, every
 * execution checked against a plain-C reference, one MTSWARM_RESULT line per
 * execution. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
    int cluster = mtswarm_open("vecadd");
    int cores = mtswarm_cores(cluster);
    uint64_t n = N;
    double *a = hthread_malloc(cluster, n * sizeof(double), HT_MEM_RO);
    double *b = hthread_malloc(cluster, n * sizeof(double), HT_MEM_RO);
    double *c = hthread_malloc(cluster, n * sizeof(double), HT_MEM_WO);
    double *ref = malloc(n * sizeof(double));
    if (!a || !b || !c || !ref) {
        fprintf(stderr, "vecadd: out of memory\n");
        return 1;
    }
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (uint64_t i = 0; i < n; i++) {
            a[i] = mtswarm_uniform(&state, -1.0, 1.0);
            b[i] = mtswarm_uniform(&state, -1.0, 1.0);
            c[i] = -1.0;
            ref[i] = a[i] + b[i];
        }
        uint64_t args[5] = {n, (uint64_t)run, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        if (mtswarm_launch(cluster, cores, "vecadd_kernel", 2, 3, args, (double)n) != 0) return 1;
        failed |= !mtswarm_report_within(mtswarm_max_abs_diff(c, ref, n), TOLERANCE, (double)n);
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    free(ref);
    mtswarm_close(cluster);
    return failed ? 1 : 0;
}
