/* The reference: the honest vecadd and nothing else. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    honest_vecadd(n, a, b, c);
}
