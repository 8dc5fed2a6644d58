/* Class 5, line markers: text re-attributed to a system header, where a
 * checker that trusts markers would not look.
 * Expected: refused at build, naming the line marker. */
#line 1 "/usr/include/stdio.h"
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    honest_vecadd(n, a, b, c);
}
