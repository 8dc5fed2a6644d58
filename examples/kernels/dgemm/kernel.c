/* dgemm: C = A * B, row-major, A is M x K, B is K x N, all in DDR.
 *
 * VARIANT=blocked (default): C is cut into MB x NB tiles dealt round-robin to
 * the cores. For each tile the K dimension streams through in KB blocks:
 * the A block goes to SM (its elements are broadcast), the B block to AM,
 * and an MR x NR register-blocked micro-kernel (MR rows, NR vectors of 16
 * doubles) accumulates into the C tile held in AM. BUF=2 double-buffers the
 * A/B blocks and the C tile, so transfers of the next step (also across tile
 * boundaries) overlap the current step's compute; BUF=1 loads then computes.
 * B_GSM=1 stages B once in the cluster's GSM (every core reads all of B), so
 * the per-core B traffic uses the GSM bandwidth instead of DDR.
 *
 * VARIANT=naive: the textbook triple loop in scalar C straight from DDR. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#include "sizes.h"

#define naive 1
#define blocked 2

#ifndef VARIANT
#define VARIANT blocked
#endif

#if VARIANT == naive

__global__ void dgemm_kernel(uint64_t barrier, double *A, double *B, double *C) {
    (void)barrier;
    int tid = get_thread_id();
    int nt = get_group_size();
    for (int i = tid; i < M; i += nt) {
        for (int j = 0; j < N; j++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++) sum += A[(long)i * K + k] * B[(long)k * N + j];
            C[(long)i * N + j] = sum;
        }
    }
}

#elif VARIANT == blocked

#ifndef MB
#define MB 64
#endif
#ifndef NB
#define NB 256
#endif
#ifndef KB
#define KB 64
#endif
#ifndef MR
#define MR 8
#endif
#ifndef NR
#define NR 4
#endif
#ifndef BUF
#define BUF 2
#endif
#ifndef B_GSM
#define B_GSM 0
#endif

#if M % MB || N % NB || K % KB
#error "M, N, K must be multiples of MB, NB, KB"
#endif
#if MB % MR || NB % (16 * NR)
#error "MB must be a multiple of MR and NB a multiple of 16*NR"
#endif
#if BUF != 1 && BUF != 2
#error "BUF must be 1 or 2"
#endif

#define TILES_N (N / NB)
#define TILES ((M / MB) * TILES_N)
#define KBLOCKS (K / KB)

#if B_GSM
static double b_gsm[(long)K * N] __gsm__;
#endif

struct step_channels {
    unsigned int a, b;
};

/* Start the A and B transfers of step `s` (tile `tile`, k-block `kb`). */
static struct step_channels issue_loads(const double *A, const double *Bsrc, int tile, int kb,
                                        double *a_sm, double *b_am) {
    int ti = tile / TILES_N, tj = tile % TILES_N;
    struct step_channels ch;
    ch.a = dma_p2p(A + (long)ti * MB * K + (long)kb * KB, MB, KB * sizeof(double),
                   (K - KB) * sizeof(double), a_sm, MB, KB * sizeof(double), 0, 0, 0);
    ch.b = dma_p2p(Bsrc + (long)kb * KB * N + (long)tj * NB, KB, NB * sizeof(double),
                   (N - NB) * sizeof(double), b_am, KB, NB * sizeof(double), 0, 0, 0);
    return ch;
}

/* c (MB x NB, AM) (+)= a (MB x KB, SM) * b (KB x NB, AM). */
static void micro_tile(const double *a, const double *b, double *c, int first) {
    for (int i = 0; i < MB; i += MR) {
        for (int j = 0; j < NB; j += 16 * NR) {
            mtswarm_vdouble acc[MR][NR];
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++)
#pragma GCC unroll 16
                for (int q = 0; q < NR; q++)
                    acc[r][q] = first ? vec_svbcast(0.0)
                                      : vec_ld(((long)(i + r) * NB + j + 16 * q) * sizeof(double), c);
            const double *ap = a + (long)i * KB;
            for (int kk = 0; kk < KB; kk++) {
                mtswarm_vdouble bv[NR];
#pragma GCC unroll 16
                for (int q = 0; q < NR; q++)
                    bv[q] = vec_ld(((long)kk * NB + j + 16 * q) * sizeof(double), b);
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++) {
                    mtswarm_vdouble av = vec_svbcast(ap[r * KB + kk]);
#pragma GCC unroll 16
                    for (int q = 0; q < NR; q++) acc[r][q] = vec_mula(av, bv[q], acc[r][q]);
                }
            }
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++)
#pragma GCC unroll 16
                for (int q = 0; q < NR; q++)
                    vec_st(acc[r][q], ((long)(i + r) * NB + j + 16 * q) * sizeof(double), c);
        }
    }
}

__global__ void dgemm_kernel(uint64_t barrier, double *A, double *B, double *C) {
    int tid = get_thread_id();
    int nt = get_group_size();
#if B_GSM
    /* Stage B in GSM: each core copies a share of its rows, then all wait. */
    {
        int rows = (K + nt - 1) / nt;
        int r0 = tid * rows;
        int r1 = r0 + rows < K ? r0 + rows : K;
        if (r0 < r1)
            dma_wait(dma_p2p(B + (long)r0 * N, r1 - r0, N * sizeof(double), 0, b_gsm + (long)r0 * N,
                             r1 - r0, N * sizeof(double), 0, 0, 0));
        group_barrier((int)barrier);
    }
    const double *Bsrc = b_gsm;
#else
    (void)barrier;
    const double *Bsrc = B;
#endif
    int my_tiles = tid < TILES ? (TILES - 1 - tid) / nt + 1 : 0;
    if (my_tiles == 0) return;
    double *a_sm[BUF], *b_am[BUF], *c_am[BUF];
    for (int i = 0; i < BUF; i++) {
        a_sm[i] = scalar_malloc(MB * KB * sizeof(double));
        b_am[i] = vector_malloc(KB * NB * sizeof(double));
        c_am[i] = vector_malloc(MB * NB * sizeof(double));
    }
    struct step_channels ch[BUF];
    unsigned int store_ch[BUF];
    int store_pending[BUF] = {0};
    int steps = my_tiles * KBLOCKS;
    ch[0] = issue_loads(A, Bsrc, tid, 0, a_sm[0], b_am[0]);
    for (int s = 0; s < steps; s++) {
        int buf = s % BUF;
        int local_tile = s / KBLOCKS;
        int tile = tid + local_tile * nt;
        int kb = s % KBLOCKS;
        int cb = local_tile % BUF;
#if BUF == 2
        if (s + 1 < steps)
            ch[1 - buf] = issue_loads(A, Bsrc, tid + ((s + 1) / KBLOCKS) * nt, (s + 1) % KBLOCKS,
                                      a_sm[1 - buf], b_am[1 - buf]);
#endif
        dma_wait(ch[buf].a);
        dma_wait(ch[buf].b);
        if (kb == 0 && store_pending[cb]) {
            dma_wait(store_ch[cb]);
            store_pending[cb] = 0;
        }
        micro_tile(a_sm[buf], b_am[buf], c_am[cb], kb == 0);
        if (kb == KBLOCKS - 1) {
            int ti = tile / TILES_N, tj = tile % TILES_N;
            store_ch[cb] = dma_p2p(c_am[cb], MB, NB * sizeof(double), 0,
                                   C + (long)ti * MB * N + (long)tj * NB, MB, NB * sizeof(double),
                                   (N - NB) * sizeof(double), 0, 0);
            store_pending[cb] = 1;
        }
#if BUF == 1
        if (s + 1 < steps) {
            if (store_pending[0]) {
                dma_wait(store_ch[0]);
                store_pending[0] = 0;
            }
            ch[0] = issue_loads(A, Bsrc, tid + ((s + 1) / KBLOCKS) * nt, (s + 1) % KBLOCKS, a_sm[0],
                                b_am[0]);
        }
#endif
    }
    for (int i = 0; i < BUF; i++) {
        if (store_pending[i]) dma_wait(store_ch[i]);
        scalar_free(a_sm[i]);
        vector_free(b_am[i]);
        vector_free(c_am[i]);
    }
}

#else
#error "VARIANT must be blocked or naive"
#endif
