/* spmv: y = A x with A in CSR (row_ptr, col, val), rows split evenly across
 * the cores.
 *
 * Each core copies its row pointers to AM, streams its nonzeros (values and
 * column indices) through AM in CHUNK-element pieces (BUF=2: the next piece
 * streams in while this one is used), and reads x from AM (X_GSM=0: every
 * core copies all of x from DDR) or from GSM (X_GSM=1: the cores stage x
 * once, cooperatively). The inner loop is scalar code (an indexed gather). */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#ifndef NROWS
#define NROWS 16384
#endif
#ifndef CHUNK
#define CHUNK 4096
#endif
#ifndef BUF
#define BUF 2
#endif
#ifndef X_GSM
#define X_GSM 0
#endif
#if BUF != 1 && BUF != 2
#error "BUF must be 1 or 2"
#endif

#if X_GSM
static double x_gsm[NROWS] __gsm__;
#endif

__global__ void spmv_kernel(uint64_t barrier, uint32_t *row_ptr, uint32_t *col, double *val,
                            double *x, double *y) {
    int tid = get_thread_id();
    int nt = get_group_size();
    int per = (NROWS + nt - 1) / nt;
    int r0 = tid * per;
    int r1 = r0 + per < NROWS ? r0 + per : NROWS;
#if X_GSM
    {
        int x0 = r0 < NROWS ? r0 : NROWS, x1 = r1 > x0 ? r1 : x0;
        if (x1 > x0) scalar_load(x + x0, x_gsm + x0, (unsigned)((x1 - x0) * sizeof(double)));
        group_barrier((int)barrier);
    }
    const double *xs = x_gsm;
#else
    (void)barrier;
    double *xs_am = vector_malloc(NROWS * sizeof(double));
    unsigned int x_ch = vector_load_async(x, xs_am, NROWS * sizeof(double));
    const double *xs = xs_am;
#endif
    if (r0 >= r1) {
#if !X_GSM
        dma_wait(x_ch);
#endif
        return;
    }
    int rows = r1 - r0;
    uint32_t *rp = vector_malloc((rows + 1) * sizeof(uint32_t));
    double *ys = vector_malloc(rows * sizeof(double));
    vector_load(row_ptr + r0, rp, (rows + 1) * sizeof(uint32_t));
    double *vbuf[BUF];
    uint32_t *cbuf[BUF];
    unsigned int vch[BUF], cch[BUF];
    for (int i = 0; i < BUF; i++) {
        vbuf[i] = vector_malloc(CHUNK * sizeof(double));
        cbuf[i] = vector_malloc(CHUNK * sizeof(uint32_t));
    }
    uint32_t k0 = rp[0], k1 = rp[rows];
#define ISSUE(slot, start)                                                                       \
    do {                                                                                         \
        uint32_t n_ = k1 - (start) < CHUNK ? k1 - (start) : CHUNK;                               \
        if (n_ > 0) {                                                                            \
            vch[slot] = vector_load_async(val + (start), vbuf[slot], n_ * sizeof(double));       \
            cch[slot] = vector_load_async(col + (start), cbuf[slot], n_ * sizeof(uint32_t));     \
        }                                                                                        \
    } while (0)
    ISSUE(0, k0);
#if !X_GSM
    dma_wait(x_ch);
#endif
    int cur = 0;
    uint32_t chunk_start = k0;
    if (k1 > k0) {
        dma_wait(vch[0]);
        dma_wait(cch[0]);
    }
#if BUF == 2
    if (k0 + CHUNK < k1) ISSUE(1, k0 + CHUNK);
#endif
    for (int r = 0; r < rows; r++) {
        double sum = 0.0;
        for (uint32_t k = rp[r]; k < rp[r + 1]; k++) {
            if (k - chunk_start >= CHUNK) {
                chunk_start += CHUNK;
#if BUF == 2
                cur ^= 1;
                dma_wait(vch[cur]);
                dma_wait(cch[cur]);
                if (chunk_start + CHUNK < k1) ISSUE(cur ^ 1, chunk_start + CHUNK);
#else
                ISSUE(0, chunk_start);
                dma_wait(vch[0]);
                dma_wait(cch[0]);
#endif
            }
            sum += vbuf[cur][k - chunk_start] * xs[cbuf[cur][k - chunk_start]];
        }
        ys[r] = sum;
    }
    vector_store(ys, y + r0, rows * sizeof(double));
}
