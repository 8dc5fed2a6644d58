/* Class 3, by DMA: copy zeros over the read-only input A with dma_p2p.
 * Expected: refused, naming the read-only destination; no figure. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    double *zeros = vector_malloc(4096 * sizeof(double));
    for (int i = 0; i < 4096; i++) zeros[i] = 0.0;
    dma_wait(vector_store_async(zeros, a, 4096 * sizeof(double)));
    honest_vecadd(n, a, b, c);
}
