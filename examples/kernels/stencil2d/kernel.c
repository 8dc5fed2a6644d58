/* stencil2d: one Jacobi sweep of the 5-point stencil on an NX x NY grid,
 *   out[i][j] = C0 * in[i][j] + C1 * (in[i-1][j] + in[i+1][j] + in[i][j-1] + in[i][j+1])
 * for interior points; boundary rows and columns keep their input values.
 *
 * The interior rows are split evenly across the cores; each core streams
 * tiles of TR rows (plus one halo row above and below) through AM, computes
 * them with vector intrinsics and writes them back. BUF=2 double-buffers
 * input and output tiles so transfers overlap compute. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#include "sizes.h"

#ifndef TR
#define TR 8
#endif
#ifndef BUF
#define BUF 2
#endif
#if NY % 16 != 0
#error "NY must be a multiple of 16"
#endif
#if BUF != 1 && BUF != 2
#error "BUF must be 1 or 2"
#endif

#define C0 0.5
#define C1 0.125

static unsigned int load_tile(const double *in, int row, int rows, double *buf) {
    /* rows + 2 rows starting one above `row`: contiguous in DDR. */
    return vector_load_async(in + (long)(row - 1) * NY, buf, (unsigned)((rows + 2) * NY * sizeof(double)));
}

__global__ void stencil_kernel(uint64_t unused, double *in, double *out) {
    (void)unused;
    int tid = get_thread_id();
    int nt = get_group_size();
    int interior = NX - 2;
    int per = (interior + nt - 1) / nt;
    int r0 = 1 + tid * per;
    int r1 = r0 + per < NX - 1 ? r0 + per : NX - 1;
    if (r0 >= r1) return;
    double *ibuf[BUF], *obuf[BUF];
    for (int b = 0; b < BUF; b++) {
        ibuf[b] = vector_malloc((TR + 2) * NY * sizeof(double));
        obuf[b] = vector_malloc(TR * NY * sizeof(double));
    }
    unsigned int in_ch[BUF], out_ch[BUF];
    int out_pending[BUF] = {0};
    const mtswarm_vdouble c0 = vec_svbcast(C0), c1 = vec_svbcast(C1), one = vec_svbcast(1.0);
    int cur = 0;
    in_ch[0] = load_tile(in, r0, r1 - r0 < TR ? r1 - r0 : TR, ibuf[0]);
    for (int row = r0; row < r1; row += TR) {
        int rows = r1 - row < TR ? r1 - row : TR;
        int next = row + TR;
#if BUF == 2
        if (next < r1) in_ch[cur ^ 1] = load_tile(in, next, r1 - next < TR ? r1 - next : TR, ibuf[cur ^ 1]);
#endif
        dma_wait(in_ch[cur]);
        if (out_pending[cur]) dma_wait(out_ch[cur]);
        const double *ib = ibuf[cur];
        double *ob = obuf[cur];
        for (int i = 0; i < rows; i++) {
            const double *c = ib + (long)(i + 1) * NY;
            for (int j = 0; j < NY; j += 16) {
                mtswarm_vdouble s = vec_mula(vec_ld((j - NY) * (long)sizeof(double), c), one,
                                             vec_ld((j + NY) * (long)sizeof(double), c));
                s = vec_mula(vec_ld((j - 1) * (long)sizeof(double), c), one, s);
                s = vec_mula(vec_ld((j + 1) * (long)sizeof(double), c), one, s);
                mtswarm_vdouble v = vec_mula(c1, s, vec_muli(c0, vec_ld(j * sizeof(double), c)));
                vec_st(v, ((long)i * NY + j) * sizeof(double), ob);
            }
            ob[(long)i * NY] = c[0];
            ob[(long)i * NY + NY - 1] = c[NY - 1];
        }
        out_ch[cur] = vector_store_async(ob, out + (long)row * NY, (unsigned)(rows * NY * sizeof(double)));
        out_pending[cur] = 1;
#if BUF == 1
        dma_wait(out_ch[cur]);
        out_pending[cur] = 0;
        if (next < r1) in_ch[cur] = load_tile(in, next, r1 - next < TR ? r1 - next : TR, ibuf[cur]);
#else
        cur ^= 1;
#endif
    }
    for (int b = 0; b < BUF; b++)
        if (out_pending[b]) dma_wait(out_ch[b]);
}
