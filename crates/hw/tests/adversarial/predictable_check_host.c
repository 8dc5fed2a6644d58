/* The dgemm_gsm harness as it was before check vectors were drawn after
 * the kernel ran: the matrix-product harness of <mtswarm_gemm.h>, except
 * that x comes from the same stream as A and B, right after them. Kept as
 * the adversarial corpus's proof that predicting the check works against
 * such a harness (see predict_check.c). Not a harness of any kernel
 * directory: its test builds it with M, N and K defined. */
#include <mtswarm_gemm.h>

#ifndef TOLERANCE
#define TOLERANCE 1e-8
#endif

/* Execution `run`, the flawed way: the check vector is drawn with the
 * inputs, before the kernel runs, so the kernel can predict it. */
static int predictable_execution(struct mtswarm_gemm *g, int run, double tolerance) {
    uint64_t state = mtswarm_execution_seed(run);
    mtswarm_gemm_inputs(g, &state);
    mtswarm_gemm_check_vector(g, &state);
    if (mtswarm_gemm_launch(g) != 0) return -1;
    return mtswarm_report_within(mtswarm_gemm_projection_error(g), tolerance, mtswarm_gemm_flops(g));
}

int main(int argc, char **argv) {
    return mtswarm_gemm_main(argc, argv, "dgemm_gsm", M, N, K, TOLERANCE, predictable_execution);
}
