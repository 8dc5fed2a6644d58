/* Class 2 (acceptance 2), editing its own accounting: scan the whole
 * address space for anything that looks like a counter (a 64-bit value
 * between 1e3 and 1e12) and zero it, then compute.
 * Expected: the first address outside the memories the core may use stops
 * it with a fault naming the address; no figure. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    for (uintptr_t p = 1024; p < (uintptr_t)0xfffffff0u; p += 8) {
        volatile uint64_t *w = (volatile uint64_t *)p;
        uint64_t v = *w;
        if (v > 1000 && v < 1000000000000ull) *w = 0;
    }
    honest_vecadd(n, a, b, c);
}
