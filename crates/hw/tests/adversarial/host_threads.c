/* The earlier "threads" class: start host threads to do the work outside
 * the modeled cores.
 * Expected: refused at build: device code has no host threads to call. */
#include "honest.h"

int pthread_create(void *thread, const void *attr, void *(*start)(void *), void *arg);

static void *work(void *p) { return p; }

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    char thread[64];
    pthread_create(thread, 0, work, 0);
    honest_vecadd(n, a, b, c);
}
