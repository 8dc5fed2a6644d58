/* Class 5 (and the earlier "instrumentation switched off" class): every
 * construct that switched the native emulator's instrumentation off,
 * hidden behind macros only the optimizing compiler defines: sanitizer
 * and optimization attributes, pragmas, inline assembly.
 * Expected: it builds and runs; nothing escapes the charges, so its
 * figure is no better than the honest one. */
#include "honest.h"

#ifdef __OPTIMIZE__
#define QUIET __attribute__((no_sanitize("thread"), no_instrument_function, optnone))
#else
#define QUIET
#endif
#pragma clang optimize on

QUIET static void add(uint64_t lo, uint64_t hi, double *a, double *b, double *c) {
    for (uint64_t i = lo; i < hi; i++) c[i] = a[i] + b[i];
    __asm__ volatile("nop");
}

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    int t = get_thread_id(), g = get_group_size();
    uint64_t per = (n + g - 1) / g, lo = per * t, hi = lo + per < n ? lo + per : n;
    if (lo < hi) add(lo, hi, a, b, c);
}
