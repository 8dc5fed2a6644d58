/* The harness of a matrix-product kernel, C = A B in row-major doubles
 * (A m x k and B k x n read-only, C m x n read-write), launched as
 * `dgemm_kernel(barrier, A, B, C)`: A and B drawn from each execution's
 * seed, C checked on every execution, one MTSWARM_RESULT line per
 * execution. Every kernel directory that computes this product
 * (examples/kernels/dgemm, dgemm_gsm) runs this one harness; its host.c
 * gives the sizes and the tolerance to mtswarm_gemm_main with
 * mtswarm_gemm_execute.
 *
 * The check is Freivalds' projection: C x against A (B x) for a random x
 * with entries in [0.5, 1.5), drawn after the kernel ran from randomness it
 * cannot observe (mtswarm_check_seed), in O(n^2) instead of the O(n^3)
 * reference, so fresh inputs every execution cost no more than the
 * kernel's own emulation. A wrong element c_ij shows as an error of at
 * least half its own in row i; max_abs_err is the largest row error. */
#ifndef MTSWARM_GEMM_H
#define MTSWARM_GEMM_H

#include "mtswarm_harness.h"

/* One product on a cluster: its sizes, where it runs and its buffers. */
struct mtswarm_gemm {
    long m, n, k;
    int cluster, cores, barrier;
    double *a, *b, *c; /* DDR buffers the kernel reads (A, B) and writes (C) */
    double *x, *bx;    /* the check vector (n) and B x (k), harness memory */
};

/* Open the cluster (mtswarm_open) and allocate an m x k by k x n product
 * on the launch's cores; a harness that cannot exits with status 1, naming
 * itself (`harness`). */
static inline void mtswarm_gemm_open(struct mtswarm_gemm *g, const char *harness, long m, long n,
                                     long k) {
    g->m = m;
    g->n = n;
    g->k = k;
    g->cluster = mtswarm_open(harness);
    g->cores = mtswarm_cores(g->cluster);
    g->a = hthread_malloc(g->cluster, (size_t)m * k * sizeof(double), HT_MEM_RO);
    g->b = hthread_malloc(g->cluster, (size_t)k * n * sizeof(double), HT_MEM_RO);
    g->c = hthread_malloc(g->cluster, (size_t)m * n * sizeof(double), HT_MEM_RW);
    g->x = malloc((size_t)n * sizeof(double));
    g->bx = malloc((size_t)k * sizeof(double));
    if (!g->a || !g->b || !g->c || !g->x || !g->bx) {
        fprintf(stderr, "%s: out of memory\n", harness);
        exit(1);
    }
    g->barrier = hthread_barrier_create(g->cluster);
}

/* Free the product's buffers and close its cluster. */
static inline void mtswarm_gemm_close(struct mtswarm_gemm *g) {
    hthread_free(g->a);
    hthread_free(g->b);
    hthread_free(g->c);
    free(g->x);
    free(g->bx);
    mtswarm_close(g->cluster);
}

/* The useful flops of one execution. */
static inline double mtswarm_gemm_flops(const struct mtswarm_gemm *g) {
    return 2.0 * g->m * g->n * g->k;
}

/* One execution's inputs: A, then B, uniform in [-0.5, 0.5) from `state`;
 * C poisoned with NaN, so an element the kernel did not write fails. */
static inline void mtswarm_gemm_inputs(struct mtswarm_gemm *g, uint64_t *state) {
    for (long i = 0; i < g->m * g->k; i++) g->a[i] = mtswarm_uniform(state, -0.5, 0.5);
    for (long i = 0; i < g->k * g->n; i++) g->b[i] = mtswarm_uniform(state, -0.5, 0.5);
    for (long i = 0; i < g->m * g->n; i++) g->c[i] = NAN;
}

/* The check vector x, uniform in [0.5, 1.5) from `state`. */
static inline void mtswarm_gemm_check_vector(struct mtswarm_gemm *g, uint64_t *state) {
    for (long j = 0; j < g->n; j++) g->x[j] = mtswarm_uniform(state, 0.5, 1.5);
}

/* Launch dgemm_kernel(barrier, A, B, C) once; -1 (reported) when the group
 * could not be created. */
static inline int mtswarm_gemm_launch(struct mtswarm_gemm *g) {
    uint64_t args[4] = {(uint64_t)g->barrier, (uint64_t)g->a, (uint64_t)g->b, (uint64_t)g->c};
    return mtswarm_launch(g->cluster, g->cores, "dgemm_kernel", 1, 3, args, mtswarm_gemm_flops(g));
}

/* max_i |(C x)_i - (A (B x))_i|; NaN anywhere gives NaN. */
static inline double mtswarm_gemm_projection_error(struct mtswarm_gemm *g) {
    long m = g->m, n = g->n, k = g->k;
    for (long kk = 0; kk < k; kk++) {
        double s = 0.0;
        for (long j = 0; j < n; j++) s += g->b[kk * n + j] * g->x[j];
        g->bx[kk] = s;
    }
    double max_err = 0.0;
    for (long i = 0; i < m; i++) {
        double want = 0.0, got = 0.0;
        for (long kk = 0; kk < k; kk++) want += g->a[i * k + kk] * g->bx[kk];
        for (long j = 0; j < n; j++) got += g->c[i * n + j] * g->x[j];
        double err = fabs(got - want);
        if (isnan(err)) return NAN;
        if (err > max_err) max_err = err;
    }
    return max_err;
}

/* One execution of the product, `run` of the launch, checked within
 * `tolerance`: 1 when valid, 0 when not, -1 when it could not run. */
typedef int (*mtswarm_gemm_execution)(struct mtswarm_gemm *g, int run, double tolerance);

/* Execution `run`: fresh inputs from its seed, the launch, then the check
 * vector from randomness the kernel cannot observe (one drawn with the
 * inputs could be predicted from them) and the reported check: the
 * harness's mtswarm_gemm_execution. */
static inline int mtswarm_gemm_execute(struct mtswarm_gemm *g, int run, double tolerance) {
    uint64_t state = mtswarm_execution_seed(run);
    mtswarm_gemm_inputs(g, &state);
    if (mtswarm_gemm_launch(g) != 0) return -1;
    uint64_t check = mtswarm_check_seed();
    mtswarm_gemm_check_vector(g, &check);
    double max_err = mtswarm_gemm_projection_error(g); /* NaN counts as a failure */
    return mtswarm_report_within(max_err, tolerance, mtswarm_gemm_flops(g));
}

/* The harness's main: `--runs N` executions of an m x k by k x n product,
 * each run by `execute` (mtswarm_gemm_execute). Returns the exit status
 * (1 when any execution was invalid or could not run). */
static inline int mtswarm_gemm_main(int argc, char **argv, const char *harness, long m, long n,
                                    long k, double tolerance, mtswarm_gemm_execution execute) {
    int runs = mtswarm_parse_runs(argc, argv);
    struct mtswarm_gemm g;
    mtswarm_gemm_open(&g, harness, m, n, k);
    int failed = 0;
    for (int run = 0; run < runs; run++) {
        int valid = execute(&g, run, tolerance);
        if (valid < 0) return 1;
        failed |= !valid;
    }
    mtswarm_gemm_close(&g);
    return failed ? 1 : 0;
}

#endif
