/* dgemm harness: the matrix-product harness of <mtswarm_gemm.h> (A and B
 * drawn from each execution's seed, C = A*B checked on every execution by
 * Freivalds' projection, one MTSWARM_RESULT line per execution) at this
 * directory's size and tolerance. */
#include <mtswarm_gemm.h>

#include "sizes.h"

#ifndef TOLERANCE
#define TOLERANCE 1e-9
#endif

int main(int argc, char **argv) {
    return mtswarm_gemm_main(argc, argv, "dgemm", M, N, K, TOLERANCE, mtswarm_gemm_execute);
}
