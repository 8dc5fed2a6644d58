/* The reference kernel's harness: fresh inputs every execution, every
 * element checked exactly, one MTSWARM_RESULT line per execution. */
#include <stdint.h>
#include <stdlib.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#define N 8192

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_open("reference");
    int cores = mtswarm_cores(cluster);
    double *a = hthread_malloc(cluster, N * sizeof(double), HT_MEM_RO);
    double *b = hthread_malloc(cluster, N * sizeof(double), HT_MEM_RO);
    double *c = hthread_malloc(cluster, N * sizeof(double), HT_MEM_WO);
    double *sum = malloc(N * sizeof(double));
    if (!a || !b || !c || !sum) return 1;
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (int i = 0; i < N; i++) {
            a[i] = mtswarm_uniform(&state, -1.0, 1.0);
            b[i] = mtswarm_uniform(&state, -1.0, 1.0);
            sum[i] = a[i] + b[i];
        }
        uint64_t args[4] = {N, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        if (mtswarm_launch(cluster, cores, "reference_kernel", 1, 3, args, (double)N) != 0) return 1;
        failed |= !mtswarm_report_within(mtswarm_max_abs_diff(c, sum, N), 0.0, (double)N);
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    free(sum);
    mtswarm_close(cluster);
    return failed ? 1 : 0;
}
