/* spmv harness: a banded random CSR matrix (fixed structure, values and x
 * drawn from each execution's seed), y = A x checked on every execution
 * against a plain-C reference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <hthread_host.h>
#include <mtswarm_harness.h>

#ifndef NROWS
#define NROWS 16384
#endif
#ifndef TOLERANCE
#define TOLERANCE 1e-12
#endif

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

int main(int argc, char **argv) {
    int runs = mtswarm_parse_runs(argc, argv);
    int cluster = mtswarm_open("spmv");
    int cores = mtswarm_cores(cluster);
    uint64_t seed = 42;
    uint32_t *row_ptr = hthread_malloc(cluster, (NROWS + 1) * sizeof(uint32_t), HT_MEM_RO);
    uint32_t max_nnz = (uint32_t)NROWS * 24;
    uint32_t *col = hthread_malloc(cluster, max_nnz * sizeof(uint32_t), HT_MEM_RO);
    double *val = hthread_malloc(cluster, max_nnz * sizeof(double), HT_MEM_RO);
    double *x = hthread_malloc(cluster, NROWS * sizeof(double), HT_MEM_RO);
    double *y = hthread_malloc(cluster, NROWS * sizeof(double), HT_MEM_WO);
    double *ref = malloc(NROWS * sizeof(double));
    if (!row_ptr || !col || !val || !x || !y || !ref) return 1;
    uint32_t nnz = 0;
    for (uint32_t r = 0; r < NROWS; r++) {
        row_ptr[r] = nnz;
        uint32_t count = 8 + lcg(&seed) % 17;
        for (uint32_t i = 0; i < count; i++) {
            int64_t c = (int64_t)r + (int64_t)(lcg(&seed) % 513) - 256;
            col[nnz] = (uint32_t)((c % NROWS + NROWS) % NROWS);
            val[nnz] = (double)(lcg(&seed) % 2001) / 1000.0 - 1.0;
            nnz++;
        }
    }
    row_ptr[NROWS] = nnz;
    int barrier = hthread_barrier_create(cluster);
    double flops = 2.0 * nnz;
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        /* Fresh values and x from this execution's seed; the structure stays. */
        uint64_t state = mtswarm_execution_seed(run);
        for (uint32_t k = 0; k < nnz; k++) val[k] = mtswarm_uniform(&state, -1.0, 1.0);
        for (uint32_t i = 0; i < NROWS; i++) x[i] = mtswarm_uniform(&state, -1.0, 1.0);
        for (uint32_t r = 0; r < NROWS; r++) {
            double s = 0.0;
            for (uint32_t k = row_ptr[r]; k < row_ptr[r + 1]; k++) s += val[k] * x[col[k]];
            ref[r] = s;
        }
        for (uint32_t i = 0; i < NROWS; i++) y[i] = NAN;
        uint64_t args[6] = {(uint64_t)barrier, (uint64_t)row_ptr, (uint64_t)col,
                            (uint64_t)val,     (uint64_t)x,       (uint64_t)y};
        if (mtswarm_launch(cluster, cores, "spmv_kernel", 1, 5, args, flops) != 0) return 1;
        failed |= !mtswarm_report_within(mtswarm_max_abs_diff(y, ref, NROWS), TOLERANCE, flops);
    }
    mtswarm_close(cluster);
    return failed ? 1 : 0;
}
