/* The reference kernel's harness: fresh inputs every execution, every
 * element checked, one MTSWARM_RESULT line per execution. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#define N 8192

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_cluster();
    if (hthread_dev_open(cluster) != 0 || hthread_dat_load(cluster, "kernel.dat") != 0) return 1;
    int cores = mtswarm_cores(cluster);
    double *a = hthread_malloc(cluster, N * sizeof(double), HT_MEM_RO);
    double *b = hthread_malloc(cluster, N * sizeof(double), HT_MEM_RO);
    double *c = hthread_malloc(cluster, N * sizeof(double), HT_MEM_WO);
    if (!a || !b || !c) return 1;
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (int i = 0; i < N; i++) {
            a[i] = mtswarm_uniform(&state, -1.0, 1.0);
            b[i] = mtswarm_uniform(&state, -1.0, 1.0);
        }
        uint64_t args[4] = {N, (uint64_t)a, (uint64_t)b, (uint64_t)c};
        int g = hthread_group_create(cluster, cores, "reference_kernel", 1, 3, args);
        if (g < 0) {
            mtswarm_report(0, NAN, (double)N, "hthread_group_create failed");
            return 1;
        }
        mtswarm_exec_and_wait(g);
        hthread_group_destroy(g);
        double max_err = 0.0;
        for (int i = 0; i < N; i++) {
            double err = fabs(c[i] - (a[i] + b[i]));
            if (!(err <= max_err)) max_err = err;
        }
        int valid = max_err == 0.0;
        mtswarm_report(valid, max_err, (double)N, valid ? NULL : "reference output differs");
        failed |= !valid;
    }
    hthread_free(a);
    hthread_free(b);
    hthread_free(c);
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
    return failed ? 1 : 0;
}
