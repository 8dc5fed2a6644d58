/* The reference kernel: c = a + b, split across the group's cores, each
 * core streaming its share through AM with DMA. Small and known to be
 * right, it is what tells a slice's failure from a candidate's: when a
 * candidate fails on a slice, this runs next; only if it fails too is the
 * slice failing. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#define CHUNK 512

__global__ void reference_kernel(uint64_t n, double *a, double *b, double *c) {
    int tid = get_thread_id();
    int nt = get_group_size();
    uint64_t per = (n / 16 + nt - 1) / nt * 16;
    uint64_t begin = per * tid;
    uint64_t end = begin + per < n ? begin + per : n;
    if (begin >= end) return;
    double *xa = vector_malloc(CHUNK * sizeof(double));
    double *xb = vector_malloc(CHUNK * sizeof(double));
    for (uint64_t off = begin; off < end; off += CHUNK) {
        uint64_t len = end - off < CHUNK ? end - off : CHUNK;
        vector_load(a + off, xa, (unsigned)(len * sizeof(double)));
        vector_load(b + off, xb, (unsigned)(len * sizeof(double)));
        for (uint64_t i = 0; i < len; i += 16)
            vec_st(vec_ld(i * sizeof(double), xa) + vec_ld(i * sizeof(double), xb),
                   i * sizeof(double), xa);
        vector_store(xa, c + off, (unsigned)(len * sizeof(double)));
    }
    vector_free(xa);
    vector_free(xb);
}
