/* The honest vecadd: what each kernel of this corpus computes besides its
 * attack, so its figure can be compared with the honest one. It is the
 * example kernel itself (examples/kernels/vecadd/kernel.c, which the test
 * copies beside this header as vecadd.c) at its default knobs, under
 * another name so a corpus kernel can define `vecadd_kernel`. */
#define vecadd_kernel honest_vecadd_kernel
#include "vecadd.c"
#undef vecadd_kernel

static void honest_vecadd(uint64_t n, double *a, double *b, double *c) {
    honest_vecadd_kernel(n, 0, a, b, c);
}
