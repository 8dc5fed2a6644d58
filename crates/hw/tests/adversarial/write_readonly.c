/* Class 3, writing read-only inputs: zero A and B (declared HT_MEM_RO by
 * the host) so that an all-zero C passes a check against them.
 * Expected: the first store into A stops the core, naming the read-only
 * buffer; no figure. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    int t = get_thread_id(), g = get_group_size();
    for (uint64_t i = t; i < n; i += g) {
        a[i] = 0.0;
        b[i] = 0.0;
        c[i] = 0.0;
    }
}
