/* A stack that outgrows SM: unbounded recursion with a frame on the
 * device stack.
 * Expected: stopped at the guard below the core's stack, named as a stack
 * overflow; no figure. */
#include "honest.h"

static uint64_t deep(volatile uint64_t *p, uint64_t d) {
    volatile uint64_t frame[64];
    frame[0] = d + (p ? p[0] : 0);
    return d > 1000000 ? frame[0] : deep(frame, d + 1) + 1;
}

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    honest_vecadd(n, a, b, c);
    c[0] += (double)(deep(0, e) & 0);
}
