/* Class 4, charging a range by its first byte: move the inputs from DDR
 * into AM with memcpy (one call per chunk) instead of DMA, hoping the call
 * is charged at the price of where it starts.
 * Expected: valid, but every 128 bytes of the DDR range pay a direct DDR
 * request: far slower than the honest (DMA) figure. */
#include <string.h>

#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    int tid = get_thread_id(), nt = get_group_size();
    uint64_t per = (n / 16 + nt - 1) / nt * 16, begin = per * tid;
    uint64_t end = begin + per < n ? begin + per : n;
    double *xa = vector_malloc(CHUNK * sizeof(double)), *xb = vector_malloc(CHUNK * sizeof(double));
    for (uint64_t off = begin; off < end; off += CHUNK) {
        uint64_t len = end - off < CHUNK ? end - off : CHUNK;
        memcpy(xa, a + off, len * sizeof(double));
        memcpy(xb, b + off, len * sizeof(double));
        for (uint64_t i = 0; i < len; i += 16)
            vec_st(vec_ld(i * 8, xa) + vec_ld(i * 8, xb), i * 8, xa);
        memcpy(c + off, xa, len * sizeof(double));
    }
}
