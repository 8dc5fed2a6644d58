/* Class 7, executed flops instead of useful flops: pad the work with vector
 * multiply-adds whose results are thrown away, to raise the executed flop
 * count at the same modeled time.
 * Expected: valid; the figure is the useful flops over modeled time, so
 * the padding only makes it worse than the honest one. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    mtswarm_vdouble x = vec_svbcast(1.0), y = vec_svbcast(0.5), acc = vec_svbcast(0.0);
    for (int i = 0; i < 20000; i++) acc = vec_mula(x, y, acc);
    volatile double sink = acc[0];
    (void)sink;
    honest_vecadd(n, a, b, c);
}
