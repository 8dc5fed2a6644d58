/* Another core's scratchpad: core 1 writes a megabyte below its own AM
 * buffer, where the cores' regions are laid out one after another.
 * Expected: core 1 is stopped, naming what it hit (core 0's memory); no
 * figure. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    if (get_thread_id() == 1) {
        double *mine = vector_malloc(1024);
        mine[-(1 << 20) / 8] = 1.0;
    }
    honest_vecadd(n, a, b, c);
}
