/* stencil2d harness: a grid drawn from each execution's seed, one sweep per
 * execution checked against a plain-C reference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#ifndef NX
#define NX 1024
#endif
#ifndef NY
#define NY 1024
#endif
#ifndef TOLERANCE
#define TOLERANCE 1e-12
#endif

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_cluster();
    if (hthread_dev_open(cluster) != 0 || hthread_dat_load(cluster, "kernel.dat") != 0) return 1;
    int cores = mtswarm_cores(cluster);
    size_t cells = (size_t)NX * NY;
    double *in = hthread_malloc(cluster, cells * sizeof(double), HT_MEM_RO);
    double *out = hthread_malloc(cluster, cells * sizeof(double), HT_MEM_RW);
    double *ref = malloc(cells * sizeof(double));
    if (!in || !out || !ref) return 1;
    double flops = 6.0 * (NX - 2) * (NY - 2);
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        uint64_t state = mtswarm_execution_seed(run);
        for (size_t i = 0; i < cells; i++) in[i] = mtswarm_uniform(&state, 0.0, 2.0);
        for (long i = 0; i < NX; i++)
            for (long j = 0; j < NY; j++) {
                long p = i * NY + j;
                if (i == 0 || j == 0 || i == NX - 1 || j == NY - 1)
                    ref[p] = in[p];
                else
                    ref[p] = 0.5 * in[p] + 0.125 * (in[p - NY] + in[p + NY] + in[p - 1] + in[p + 1]);
            }
        for (long i = 0; i < NX; i++)
            for (long j = 0; j < NY; j++) {
                long p = i * NY + j;
                out[p] = (i == 0 || i == NX - 1) ? in[p] : NAN;
            }
        uint64_t args[3] = {0, (uint64_t)in, (uint64_t)out};
        int g = hthread_group_create(cluster, cores, "stencil_kernel", 1, 2, args);
        if (g < 0) return 1;
        mtswarm_exec_and_wait(g);
        hthread_group_destroy(g);
        double max_err = 0.0;
        for (size_t i = 0; i < cells; i++) {
            double err = fabs(out[i] - ref[i]);
            if (!(err <= max_err)) max_err = err;
        }
        int valid = max_err <= TOLERANCE;
        char msg[128];
        snprintf(msg, sizeof msg, "max_abs_err %.3e exceeds tolerance %.1e", max_err, (double)TOLERANCE);
        mtswarm_report(valid, max_err, flops, valid ? NULL : msg);
        failed |= !valid;
    }
    hthread_dat_unload(cluster);
    hthread_dev_close(cluster);
    return failed ? 1 : 0;
}
