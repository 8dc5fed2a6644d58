/* The earlier "direct DDR access" class: a scalar loop straight on the DDR
 * buffers, no DMA.
 * Expected: valid, and far slower than the honest (DMA) figure: every
 * access stalls for DDR's latency and shares the core's port. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    int t = get_thread_id(), g = get_group_size();
    uint64_t per = (n + g - 1) / g, lo = per * t, hi = lo + per < n ? lo + per : n;
    for (uint64_t i = lo; i < hi; i++) c[i] = a[i] + b[i];
}
