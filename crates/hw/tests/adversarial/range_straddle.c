/* Class 4, a range that runs from the core's AM into what lies beyond it
 * (another core's memory), copied in one call.
 * Expected: refused, the range is not one memory the core may use. */
#include <string.h>

#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    char *am = vector_malloc(768 * 1024);
    char scratch[256];
    volatile unsigned long len = sizeof scratch; /* a real call, not inlined loads */
    memcpy(scratch, am + 768 * 1024 - 64, len);
    vector_free(am);
    double sum = 0.0;
    for (int i = 0; i < 256; i++) sum += scratch[i];
    honest_vecadd(n, a, b, c);
    c[0] += sum * 0.0;
}
