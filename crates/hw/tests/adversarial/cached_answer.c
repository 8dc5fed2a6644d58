/* The earlier "cached answers across runs" class: compute once, remember
 * the output in static memory, replay it in the next executions.
 * Expected (on one core): the first execution is valid, every later one
 * invalid (inputs change every execution). */
#include "honest.h"

static double saved[1 << 16];
static int have;

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    int t = get_thread_id(), g = get_group_size();
    for (uint64_t i = t; i < n; i += g) c[i] = have ? saved[i] : a[i] + b[i];
    if (!have && t == 0) {
        for (uint64_t i = 0; i < n; i++) saved[i] = c[i];
        have = 1;
    }
}
