/* Class 8, a host oracle: test whether host paths exist, one bit a build.
 * Expected: it builds and runs: the device compile sees no host path, so
 * every test says "absent". */
#if __has_include("/etc/passwd") || __has_include("/etc/hostname") || \
    __has_include("/usr/include/stdio.h") || __has_include(<stdio.h>) || \
    __has_include("/proc/self/status") || __has_include("/root")
#error "a host path is visible to device code"
#endif
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    honest_vecadd(n, a, b, c);
}
