/* MT-3000 vector intrinsics, emulator edition.
 *
 * Same names as the vendor's <compiler/m3000.h> so kernel sources build for
 * the board unchanged. One `lvector double` is one 1024-bit vector register:
 * 16 FP64 lanes. Each intrinsic executes on the host and, under the
 * emulator's cycle model, charges one issue in its VLIW issue class (FMA
 * units, vector load/store units, broadcast unit) of the calling core.
 * Arithmetic written with plain C operators on vectors is not charged as
 * vector work; use the intrinsics. */
#ifndef MTSWARM_M3000_H
#define MTSWARM_M3000_H

#include <stdint.h>
#include <string.h>

#define MTSWARM_VECTOR_BYTES 128
#define lvector __attribute__((vector_size(MTSWARM_VECTOR_BYTES)))

typedef lvector double mtswarm_vdouble;

/* Per-core issue counters of the running device thread, folded into the
 * core's clock by the runtime at every synchronisation point. The field
 * order is known to the build (scalar_millicycles at offset 0, scalar_flops
 * at offset 8: the build's scalar-cost pass adds to both inline).
 *
 * Loads and stores are not charged here: the kernel is compiled with gcc's
 * thread-sanitizer instrumentation, and the runtime's __tsan_read / write
 * hooks charge every access by the memory level it touches (see
 * emu_runtime.c), the accesses of vec_ld / vec_st included. */
struct mtswarm_issue_counters {
    uint64_t scalar_millicycles; /* scalar basic blocks, charged by the build */
    uint64_t scalar_flops;       /* scalar FP arithmetic, charged by the build */
    uint64_t vector_fma;         /* fused multiply-adds (2 flops per lane) */
    uint64_t vector_mul;         /* multiplies on the FMA units (1 flop per lane) */
    uint64_t vector_mem;         /* vector accesses to this core's AM */
    uint64_t vector_bcast;
    uint64_t sm_words;           /* words of bulk (>= 16 byte) accesses to SM */
    uint64_t gsm_accesses, gsm_bytes; /* direct accesses to the cluster's GSM */
    uint64_t ddr_accesses, ddr_bytes; /* direct (non-DMA) accesses to DDR */
    /* This core's windows, set by the runtime when the core starts. */
    uintptr_t am_lo, am_hi, sm_lo, sm_hi, stack_lo, stack_hi;
};
extern __thread struct mtswarm_issue_counters mtswarm_issue;

#define MTSWARM_OFF(field) __builtin_offsetof(struct mtswarm_issue_counters, field)

#if defined(MTSWARM_HOST_BACKEND)
#define MTSWARM_CHARGE(field) ((void)0)
#elif defined(__x86_64__)
/* The charging code is inline assembly whose lines end in `#mtswarm`, so the
 * build's scalar-cost pass can leave it out of the kernel's instruction
 * counts: bookkeeping must not cost modeled cycles. */
#define MTSWARM_CHARGE(field)                                                     \
    __asm__ volatile("addq $1, %%fs:mtswarm_issue@tpoff+%c0 #mtswarm"            \
                     :                                                            \
                     : "i"(MTSWARM_OFF(field))                                    \
                     : "cc")
#else
#define MTSWARM_CHARGE(field) (mtswarm_issue.field += 1)
#endif

/* Load 16 doubles (any alignment). */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_ld(unsigned long offset,
                                                                    const void *base) {
    const char *p = (const char *)base + offset;
    mtswarm_vdouble v;
    memcpy(&v, p, sizeof v); /* one 128-byte access: charged by the hooks */
    return v;
}

static inline __attribute__((always_inline)) void vec_st(mtswarm_vdouble v, unsigned long offset,
                                                         void *base) {
    char *p = (char *)base + offset;
    memcpy(p, &v, sizeof v);
}

/* a * b + c, fused. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_mula(mtswarm_vdouble a,
                                                                      mtswarm_vdouble b,
                                                                      mtswarm_vdouble c) {
    MTSWARM_CHARGE(vector_fma);
    return a * b + c;
}

/* a * b. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_muli(mtswarm_vdouble a,
                                                                      mtswarm_vdouble b) {
    MTSWARM_CHARGE(vector_mul);
    return a * b;
}

/* Broadcast a scalar to all 16 lanes. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_svbcast(double s) {
    MTSWARM_CHARGE(vector_bcast);
    /* Built from a host-native pair so the host code stays packed moves
     * (scalar-cost accounting leaves those to the vector unit). */
    typedef double mtswarm_pair __attribute__((vector_size(16)));
    union {
        mtswarm_pair pair[8];
        mtswarm_vdouble v;
    } u;
    mtswarm_pair p = {s, s};
    /* Written out: a loop here would add basic blocks to the kernel. */
    u.pair[0] = p, u.pair[1] = p, u.pair[2] = p, u.pair[3] = p;
    u.pair[4] = p, u.pair[5] = p, u.pair[6] = p, u.pair[7] = p;
    return u.v;
}

#endif
