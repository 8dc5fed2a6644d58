/* Device memory beyond the layout: grow the linear memory and work there,
 * outside every checked range.
 * Expected: refused at build: device memory has a fixed size. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    long pages = __builtin_wasm_memory_grow(0, 16);
    honest_vecadd(n, a, b, c);
    c[0] += (double)(pages & 0);
}
