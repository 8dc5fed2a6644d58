/* vecadd: c = a + b over N doubles, split evenly across the group's cores.
 *
 * Knobs: CHUNK (doubles per DMA transfer, a multiple of 16), BUF (1 = single
 * buffering, 2 = double buffering: the next chunk streams in while this one
 * is computed). Test knob: FAULT_AFTER=k makes every execution after the
 * k-th write one wrong element, so measurement code can prove it re-checks
 * the outputs of timed runs. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#ifndef CHUNK
#define CHUNK 2048
#endif
#ifndef BUF
#define BUF 2
#endif
#if CHUNK % 16 != 0
#error "CHUNK must be a multiple of 16 (one vector is 16 doubles)"
#endif
#if BUF != 1 && BUF != 2
#error "BUF must be 1 or 2"
#endif

__global__ void vecadd_kernel(uint64_t n, uint64_t exec_index, double *a, double *b, double *c) {
    int tid = get_thread_id();
    int nt = get_group_size();
    uint64_t per = (n / 16 + nt - 1) / nt * 16;
    uint64_t begin = per * tid;
    uint64_t end = begin + per < n ? begin + per : n;
    if (begin >= end) return;

    double *xa[BUF], *xb[BUF];
    for (int i = 0; i < BUF; i++) {
        xa[i] = vector_malloc(CHUNK * sizeof(double));
        xb[i] = vector_malloc(CHUNK * sizeof(double));
    }
    const mtswarm_vdouble one = vec_svbcast(1.0);
    unsigned int ch_a[BUF], ch_b[BUF];
    unsigned int out_ch = 0;
    int have_out = 0;

    uint64_t len0 = end - begin < CHUNK ? end - begin : CHUNK;
    ch_a[0] = vector_load_async(a + begin, xa[0], (unsigned)(len0 * sizeof(double)));
    ch_b[0] = vector_load_async(b + begin, xb[0], (unsigned)(len0 * sizeof(double)));
    int cur = 0;
    for (uint64_t off = begin; off < end; off += CHUNK) {
        uint64_t len = end - off < CHUNK ? end - off : CHUNK;
        uint64_t next = off + CHUNK;
        int nb = (cur + 1) % BUF;
#if BUF == 2
        if (next < end) {
            uint64_t nlen = end - next < CHUNK ? end - next : CHUNK;
            if (have_out) dma_wait(out_ch); /* the store still reads xa[nb] */
            ch_a[nb] = vector_load_async(a + next, xa[nb], (unsigned)(nlen * sizeof(double)));
            ch_b[nb] = vector_load_async(b + next, xb[nb], (unsigned)(nlen * sizeof(double)));
        }
#endif
        dma_wait(ch_a[cur]);
        dma_wait(ch_b[cur]);
        for (uint64_t i = 0; i < len; i += 16) {
            mtswarm_vdouble va = vec_ld(i * sizeof(double), xa[cur]);
            mtswarm_vdouble vb = vec_ld(i * sizeof(double), xb[cur]);
            vec_st(vec_mula(va, one, vb), i * sizeof(double), xa[cur]);
        }
#ifdef FAULT_AFTER
        if (exec_index >= FAULT_AFTER && off == begin) xa[cur][0] += 1.0;
#else
        (void)exec_index;
#endif
        out_ch = vector_store_async(xa[cur], c + off, (unsigned)(len * sizeof(double)));
        have_out = 1;
#if BUF == 1
        dma_wait(out_ch);
        if (next < end) {
            uint64_t nlen = end - next < CHUNK ? end - next : CHUNK;
            ch_a[nb] = vector_load_async(a + next, xa[nb], (unsigned)(nlen * sizeof(double)));
            ch_b[nb] = vector_load_async(b + next, xb[nb], (unsigned)(nlen * sizeof(double)));
        }
#endif
        cur = nb;
    }
    if (have_out) dma_wait(out_ch);
    for (int i = 0; i < BUF; i++) {
        vector_free(xa[i]);
        vector_free(xb[i]);
    }
}
