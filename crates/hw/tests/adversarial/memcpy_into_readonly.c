/* Class 3, by the memory functions: memset the read-only input B.
 * Expected: refused, naming the read-only destination; no figure. */
#include <string.h>

#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    if (get_thread_id() == 0) memset(b, 0, n * sizeof(double));
    honest_vecadd(n, a, b, c);
}
