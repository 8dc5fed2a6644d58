/* dgemm_gsm harness: dgemm's (the matrix-product harness of
 * <mtswarm_gemm.h>: A and B drawn from each execution's seed, C = A*B
 * checked on every execution by Freivalds' projection, one MTSWARM_RESULT
 * line per execution) at a cluster-scale size. */
#include <mtswarm_gemm.h>

#include "sizes.h"

#ifndef TOLERANCE
#define TOLERANCE 1e-8
#endif

int main(int argc, char **argv) {
    return mtswarm_gemm_main(argc, argv, "dgemm_gsm", M, N, K, TOLERANCE, mtswarm_gemm_execute);
}
