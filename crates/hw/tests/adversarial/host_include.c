/* The earlier "host includes" class: include a host file to read it (its
 * text would come back in the compiler's diagnostics).
 * Expected: refused at build, and no text of the file in the error. */
#include "/etc/passwd"
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    honest_vecadd(n, a, b, c);
}
