/* MT-3000 vector intrinsics, emulator edition.
 *
 * Same names as the vendor's <compiler/m3000.h> so kernel sources build for
 * the board unchanged. One `lvector double` is one 1024-bit vector register:
 * 16 FP64 lanes. The intrinsics are plain vector arithmetic: under the
 * emulator the kernel is WebAssembly, and the cycle model charges what the
 * compiled code does (every 128-bit operation as an eighth of a vector
 * issue in its unit, a multiply and an add of the same stretch of code as
 * one fused multiply-add, a broadcast as one issue, a load or store by the
 * memory it touches), whether it was written with these intrinsics or with
 * C operators on vectors. */
#ifndef MTSWARM_M3000_H
#define MTSWARM_M3000_H

#define MTSWARM_VECTOR_BYTES 128
#define lvector __attribute__((vector_size(MTSWARM_VECTOR_BYTES)))

typedef lvector double mtswarm_vdouble;

/* Load 16 doubles (any alignment) from base + offset bytes. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_ld(unsigned long offset,
                                                                    const void *base) {
    mtswarm_vdouble v;
    __builtin_memcpy(&v, (const char *)base + offset, sizeof v);
    return v;
}

/* Store 16 doubles (any alignment) at base + offset bytes. */
static inline __attribute__((always_inline)) void vec_st(mtswarm_vdouble v, unsigned long offset,
                                                         void *base) {
    __builtin_memcpy((char *)base + offset, &v, sizeof v);
}

/* a * b + c, fused. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_mula(mtswarm_vdouble a,
                                                                      mtswarm_vdouble b,
                                                                      mtswarm_vdouble c) {
    return a * b + c;
}

/* a * b. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_muli(mtswarm_vdouble a,
                                                                      mtswarm_vdouble b) {
    return a * b;
}

/* Broadcast a scalar to all 16 lanes. */
static inline __attribute__((always_inline)) mtswarm_vdouble vec_svbcast(double s) {
    mtswarm_vdouble v = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
    return v;
}

#endif
