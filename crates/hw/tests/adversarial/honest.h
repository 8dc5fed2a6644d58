/* The honest vecadd (examples/kernels/vecadd at CHUNK=2048, BUF=2): what
 * each kernel of this corpus computes besides its attack, so its figure
 * can be compared with the honest one. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#define CHUNK 2048

static void honest_vecadd(uint64_t n, double *a, double *b, double *c) {
    int tid = get_thread_id();
    int nt = get_group_size();
    uint64_t per = (n / 16 + nt - 1) / nt * 16;
    uint64_t begin = per * tid;
    uint64_t end = begin + per < n ? begin + per : n;
    if (begin >= end) return;
    double *xa[2], *xb[2];
    for (int i = 0; i < 2; i++) {
        xa[i] = vector_malloc(CHUNK * sizeof(double));
        xb[i] = vector_malloc(CHUNK * sizeof(double));
    }
    const mtswarm_vdouble one = vec_svbcast(1.0);
    unsigned int ch_a[2], ch_b[2];
    unsigned int out_ch = 0;
    int have_out = 0;
    uint64_t len0 = end - begin < CHUNK ? end - begin : CHUNK;
    ch_a[0] = vector_load_async(a + begin, xa[0], (unsigned)(len0 * sizeof(double)));
    ch_b[0] = vector_load_async(b + begin, xb[0], (unsigned)(len0 * sizeof(double)));
    int cur = 0;
    for (uint64_t off = begin; off < end; off += CHUNK) {
        uint64_t len = end - off < CHUNK ? end - off : CHUNK;
        uint64_t next = off + CHUNK;
        int nb = (cur + 1) % 2;
        if (next < end) {
            uint64_t nlen = end - next < CHUNK ? end - next : CHUNK;
            if (have_out) dma_wait(out_ch);
            ch_a[nb] = vector_load_async(a + next, xa[nb], (unsigned)(nlen * sizeof(double)));
            ch_b[nb] = vector_load_async(b + next, xb[nb], (unsigned)(nlen * sizeof(double)));
        }
        dma_wait(ch_a[cur]);
        dma_wait(ch_b[cur]);
        for (uint64_t i = 0; i < len; i += 16) {
            mtswarm_vdouble va = vec_ld(i * sizeof(double), xa[cur]);
            mtswarm_vdouble vb = vec_ld(i * sizeof(double), xb[cur]);
            vec_st(vec_mula(va, one, vb), i * sizeof(double), xa[cur]);
        }
        out_ch = vector_store_async(xa[cur], c + off, (unsigned)(len * sizeof(double)));
        have_out = 1;
        cur = nb;
    }
    if (have_out) dma_wait(out_ch);
    for (int i = 0; i < 2; i++) {
        vector_free(xa[i]);
        vector_free(xb[i]);
    }
}
