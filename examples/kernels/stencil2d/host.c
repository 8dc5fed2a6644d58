/* stencil2d harness: a grid drawn from each execution's seed, one sweep per
 * execution checked against a plain-C reference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#include "sizes.h"

#ifndef TOLERANCE
#define TOLERANCE 1e-12
#endif

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_open("stencil2d");
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
        if (mtswarm_launch(cluster, cores, "stencil_kernel", 1, 2, args, flops) != 0) return 1;
        failed |= !mtswarm_report_within(mtswarm_max_abs_diff(out, ref, cells), TOLERANCE, flops);
    }
    mtswarm_close(cluster);
    return failed ? 1 : 0;
}
