/* Class 2 (acceptance 2), editing its own accounting within bounds: zero
 * every counter-like word of every byte the core can legitimately reach (all
 * of its AM and SM, its stack, the kernel's static data), in the middle of
 * the work and at its end.
 * Expected: valid, and no better than the honest figure (the scan costs
 * cycles; no counter lives where device code can reach). */
#include "honest.h"

static double statics[4096];

static void zero_counters(volatile uint64_t *p, uint64_t words) {
    for (uint64_t i = 0; i < words; i++) {
        uint64_t v = p[i];
        if (v > 1000 && v < 1000000000000ull) p[i] = 0;
    }
}

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    volatile uint64_t frame[512];
    for (int i = 0; i < 512; i++) frame[i] = 12345;
    uint64_t *am = vector_malloc(512 * 1024);
    uint64_t *sm = scalar_malloc(48 * 1024);
    zero_counters((volatile uint64_t *)am, 512 * 1024 / 8);
    zero_counters((volatile uint64_t *)sm, 48 * 1024 / 8);
    zero_counters(frame, 512);
    zero_counters((volatile uint64_t *)statics, 4096);
    vector_free(am);
    scalar_free(sm);
    honest_vecadd(n, a, b, c);
    am = vector_malloc(512 * 1024);
    zero_counters((volatile uint64_t *)am, 512 * 1024 / 8);
    vector_free(am);
}
