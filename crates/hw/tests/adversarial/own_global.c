/* Device state outside memory: a WebAssembly global of its own, declared
 * in inline assembly, that no memory check would see.
 * Expected: refused at build: device code defines no globals. */
#include "honest.h"

__asm__(".globaltype my_counter, i64\nmy_counter:\n");

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    long long v;
    __asm__ volatile("global.get my_counter\nlocal.set %0" : "=r"(v));
    honest_vecadd(n, a, b, c);
    c[0] += (double)(v & 0);
}
