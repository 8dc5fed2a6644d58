/* dgemm_gsm: C = A * B, row-major, A is M x K, B is K x N, all in DDR, at a
 * size that feeds a whole cluster (24 cores), blocked for the three levels
 * of the memory hierarchy:
 *
 * - GSM (shared by the cluster): K is cut into chunks of KG. Chunk c of A
 *   (all M rows, KG columns) and of B (KG rows, all N columns) are staged in
 *   GSM once and read by every core; two GSM buffers let the cores stage
 *   chunk c+1 while they compute on chunk c. The staging is shared: each
 *   core copies its M/cores rows of A and N/cores columns of B, in KG/KB
 *   pieces interleaved with its own block loads so that its DMA engine
 *   never sits idle; a barrier per chunk makes the next chunk visible.
 * - AM/SM (per core): C is cut into MG x NB tiles dealt round-robin to the
 *   cores (one round = one tile per core; several rounds re-stage A and B).
 *   A core's C tile stays in AM for the whole K, so C goes to DDR once. For
 *   each k-step of KB, the core loads the A block (MG x KB, broadcast
 *   operands) from GSM into SM and the B block (KB x NB) from GSM into AM;
 *   BUF=2 double-buffers them, BUF=1 loads then computes.
 * - Registers: an MR x NR micro-kernel (MR rows, NR vectors of 16 doubles)
 *   keeps MR * NR accumulators; MR * NR / fma_per_lane cycles of FMAs per k
 *   against MR broadcasts and NR vector loads.
 *
 * Per core and per k, the A and B blocks cost 8 (MG + NB) bytes of GSM
 * bandwidth for 2 MG NB flops, and the staging 8 (M + N) / cores bytes of
 * DDR: large tiles and a one-round grid keep both under the compute time. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#include "sizes.h"

#ifndef MG
#define MG 288
#endif
#ifndef NB
#define NB 288
#endif
#ifndef KG
#define KG 128
#endif
#ifndef KB
#define KB 8
#endif
#ifndef MR
#define MR 8
#endif
#ifndef NR
#define NR 6
#endif
#ifndef BUF
#define BUF 2
#endif

#if M % MG || N % NB || K % KG || KG % KB
#error "M, N, K must be multiples of MG, NB, KG and KG of KB"
#endif
#if MG % MR || NB % (16 * NR)
#error "MG must be a multiple of MR and NB a multiple of 16*NR"
#endif
#if BUF != 1 && BUF != 2
#error "BUF must be 1 or 2"
#endif

#define TILES_N (N / NB)
#define TILES ((M / MG) * TILES_N)
#define CHUNKS (K / KG)
#define KSTEPS (KG / KB)

/* Two K-chunks of A (M x KG) and B (KG x N), shared by the cluster. */
static double a_gsm[2][(long)M * KG] __gsm__;
static double b_gsm[2][(long)KG * N] __gsm__;

/* This core's share of the staging: rows [a0, a1) of A, columns [b0, b1)
 * of B. */
struct share {
    int a0, a1, b0, b1;
};

static struct share my_share(int tid, int nt) {
    struct share s;
    int ar = (M + nt - 1) / nt, bc = (N + nt - 1) / nt;
    s.a0 = tid * ar < M ? tid * ar : M;
    s.a1 = s.a0 + ar < M ? s.a0 + ar : M;
    s.b0 = tid * bc < N ? tid * bc : N;
    s.b1 = s.b0 + bc < N ? s.b0 + bc : N;
    return s;
}

/* Start piece `j` (KB columns of A, KB rows of B) of this core's share of
 * chunk `c` into GSM buffer c % 2. Returns the last channel issued (the
 * engine completes in order), or `prev` if the share is empty. */
static unsigned int stage_piece(const double *A, const double *B, struct share s, int c, int j,
                                unsigned int prev) {
    unsigned int ch = prev;
    long k0 = (long)c * KG + (long)j * KB;
    if (s.a0 < s.a1)
        ch = dma_p2p(A + (long)s.a0 * K + k0, s.a1 - s.a0, KB * sizeof(double),
                     (K - KB) * sizeof(double), a_gsm[c % 2] + (long)s.a0 * KG + (long)j * KB,
                     s.a1 - s.a0, KB * sizeof(double), (KG - KB) * sizeof(double), 0, 0);
    if (s.b0 < s.b1)
        ch = dma_p2p(B + k0 * N + s.b0, KB, (s.b1 - s.b0) * sizeof(double),
                     (N - (s.b1 - s.b0)) * sizeof(double),
                     b_gsm[c % 2] + (long)j * KB * N + s.b0, KB, (s.b1 - s.b0) * sizeof(double),
                     (N - (s.b1 - s.b0)) * sizeof(double), 0, 0);
    return ch;
}

struct step_channels {
    unsigned int a, b;
};

/* Start the A (GSM -> SM) and B (GSM -> AM) blocks of k-step `j` of chunk
 * `c` for C tile `tile`. */
static struct step_channels load_blocks(int tile, int c, int j, double *a_sm, double *b_am) {
    int ti = tile / TILES_N, tj = tile % TILES_N;
    struct step_channels ch;
    ch.a = dma_p2p(a_gsm[c % 2] + (long)ti * MG * KG + (long)j * KB, MG, KB * sizeof(double),
                   (KG - KB) * sizeof(double), a_sm, MG, KB * sizeof(double), 0, 0, 0);
    ch.b = dma_p2p(b_gsm[c % 2] + (long)j * KB * N + (long)tj * NB, KB, NB * sizeof(double),
                   (N - NB) * sizeof(double), b_am, KB, NB * sizeof(double), 0, 0, 0);
    return ch;
}

/* c (MG x NB, AM) (+)= a (MG x KB, SM) * b (KB x NB, AM). */
static void micro_tile(const double *a, const double *b, double *c, int first) {
    for (int i = 0; i < MG; i += MR) {
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
    struct share sh = my_share(tid, nt);
    int stages = sh.a0 < sh.a1 || sh.b0 < sh.b1; /* with more cores than rows, some copy nothing */
    double *a_sm[BUF], *b_am[BUF];
    for (int i = 0; i < BUF; i++) {
        a_sm[i] = scalar_malloc(MG * KB * sizeof(double));
        b_am[i] = vector_malloc(KB * NB * sizeof(double));
    }
    double *c_am = vector_malloc(MG * NB * sizeof(double));
    unsigned int store_ch = 0;
    int store_pending = 0;
    int rounds = (TILES + nt - 1) / nt;
    for (int round = 0; round < rounds; round++) {
        int tile = round * nt + tid;
        int active = tile < TILES;
        /* Chunk 0 of the round: staged without overlap, then published. */
        unsigned int stage_ch = 0;
        for (int j = 0; j < KSTEPS; j++) stage_ch = stage_piece(A, B, sh, 0, j, stage_ch);
        if (stages) dma_wait(stage_ch);
        group_barrier((int)barrier);
        if (active && store_pending) {
            dma_wait(store_ch); /* the previous round's tile leaves AM */
            store_pending = 0;
        }
        for (int c = 0; c < CHUNKS; c++) {
            int next = c + 1 < CHUNKS;
            struct step_channels ch[BUF];
            if (active) ch[0] = load_blocks(tile, c, 0, a_sm[0], b_am[0]);
            for (int j = 0; j < KSTEPS; j++) {
                int buf = j % BUF;
                /* Block loads of the next k-step first (they feed the
                 * compute), then a piece of the next chunk's staging. */
#if BUF == 2
                if (active && j + 1 < KSTEPS)
                    ch[1 - buf] = load_blocks(tile, c, j + 1, a_sm[1 - buf], b_am[1 - buf]);
#endif
                if (next) stage_ch = stage_piece(A, B, sh, c + 1, j, stage_ch);
                if (active) {
                    dma_wait(ch[buf].a);
                    dma_wait(ch[buf].b);
                    micro_tile(a_sm[buf], b_am[buf], c_am, c == 0 && j == 0);
#if BUF == 1
                    if (j + 1 < KSTEPS) ch[0] = load_blocks(tile, c, j + 1, a_sm[0], b_am[0]);
#endif
                }
            }
            if (next) {
                if (stages) dma_wait(stage_ch);
                /* Chunk c+1 is complete in GSM, and nobody reads chunk c's
                 * buffer (which chunk c+2 overwrites) after this point. */
                group_barrier((int)barrier);
            }
        }
        if (active) {
            int ti = tile / TILES_N, tj = tile % TILES_N;
            double *c_ddr = C + (long)ti * MG * N + (long)tj * NB;
            store_ch = dma_p2p(c_am, MG, NB * sizeof(double), 0, c_ddr, MG, NB * sizeof(double),
                               (N - NB) * sizeof(double), 0, 0);
            store_pending = 1;
        }
        /* The next round re-stages chunk 0 into GSM buffer 0, which one of
         * this round's last two chunks used: wait until every core is done
         * with this round. */
        if (round + 1 < rounds) group_barrier((int)barrier);
    }
    if (store_pending) dma_wait(store_ch);
    for (int i = 0; i < BUF; i++) {
        scalar_free(a_sm[i]);
        vector_free(b_am[i]);
    }
    vector_free(c_am);
}
