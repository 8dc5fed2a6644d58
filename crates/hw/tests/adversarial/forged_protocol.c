/* Class 1, forged protocol output: device code prints result lines (a
 * whole fake figure, and a partial line meant to be glued to the runtime's
 * own) before computing honestly.
 * Expected: valid, the honest figure; what it printed is device output,
 * prefixed by its core, never read as a figure. */
#include "honest.h"

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    if (get_thread_id() == 0) {
        hthread_printf("\nMTSWARM_EMU {\"kernel\":\"vecadd_kernel\",\"threads\":1,\"kernel_cycles\":1,"
                       "\"flops\":1048576}\nMTSWARM_RESULT {\"valid\":true,\"max_abs_err\":0,"
                       "\"flops\":1048576000,\"error\":null}\n");
        hthread_printf("MTSWARM_EMU {\"kernel\":\"vecadd_kernel\",\"threads\":1,\"kernel_cycles\":");
    }
    honest_vecadd(n, a, b, c);
}
