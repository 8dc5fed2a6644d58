/* Device-side hthreads API (the DSP cores), emulator edition.
 *
 * Under the emulator device code is WebAssembly: each DSP core of a thread
 * group is an instance of the kernel on one device memory, and these
 * functions are the runtime's (nothing else is there to call: no C
 * library, no files, no clock but get_clk). Memory levels: DDR
 * (hthread_malloc on the host), GSM (`__gsm__` arrays, shared by the
 * cluster), AM (vector_malloc, per core), SM (scalar_malloc, per core, and
 * the core's stack). Capacities and costs come from the chip spec. */
#ifndef MTSWARM_HTHREAD_DEVICE_H
#define MTSWARM_HTHREAD_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel entry points: found by name from the host, never inlined away.
 * Parameters must be 64-bit integers or pointers (as on the board, floating
 * point scalars arrive as raw bits). */
#define __global__ __attribute__((used, noinline, visibility("default")))

/* Arrays in the cluster's global shared memory. The total is checked against
 * the GSM capacity when the device is opened. */
#define __gsm__ __attribute__((section("mtswarm_gsm"), aligned(128), used))

int get_thread_id(void);
int get_group_size(void);
int get_core_id(void);
/* Synchronise all cores of the group (id from hthread_barrier_create). */
void group_barrier(int barrier_id);
/* Synchronise `ncores` cores on this barrier id. */
void core_barrier(int barrier_id, int ncores);
int hthread_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The modeled cycle counter of this core. */
unsigned long get_clk(void);

void *scalar_malloc(unsigned int bytes);
void scalar_free(void *ptr);
void *vector_malloc(unsigned int bytes);
void vector_free(void *ptr);

/* Asynchronous 2-D copy among DDR, GSM, AM and SM: `rows` rows of
 * `row_bytes` bytes, `row_gap` bytes skipped after each row, on each side.
 * Returns a channel for dma_wait/dma_query. */
unsigned int dma_p2p(const void *src, unsigned long src_rows, unsigned int src_row_bytes,
                     int src_row_gap, void *dst, unsigned long dst_rows,
                     unsigned int dst_row_bytes, int dst_row_gap, int row_syn,
                     unsigned int synmask);
void dma_wait(unsigned int channel);
/* 1 when the transfer on `channel` has completed at this core's current time. */
int dma_query(unsigned int channel);

/* Contiguous convenience transfers into/out of AM (vector_) and SM (scalar_). */
static inline unsigned int vector_load_async(const void *src, void *dst, unsigned int bytes) {
    return dma_p2p(src, 1, bytes, 0, dst, 1, bytes, 0, 0, 0);
}
static inline unsigned int vector_store_async(const void *src, void *dst, unsigned int bytes) {
    return dma_p2p(src, 1, bytes, 0, dst, 1, bytes, 0, 0, 0);
}
static inline unsigned int scalar_load_async(const void *src, void *dst, unsigned int bytes) {
    return dma_p2p(src, 1, bytes, 0, dst, 1, bytes, 0, 0, 0);
}
static inline unsigned int scalar_store_async(const void *src, void *dst, unsigned int bytes) {
    return dma_p2p(src, 1, bytes, 0, dst, 1, bytes, 0, 0, 0);
}
static inline void vector_load(const void *src, void *dst, unsigned int bytes) {
    dma_wait(vector_load_async(src, dst, bytes));
}
static inline void vector_store(const void *src, void *dst, unsigned int bytes) {
    dma_wait(vector_store_async(src, dst, bytes));
}
static inline void scalar_load(const void *src, void *dst, unsigned int bytes) {
    dma_wait(scalar_load_async(src, dst, bytes));
}
static inline void scalar_store(const void *src, void *dst, unsigned int bytes) {
    dma_wait(scalar_store_async(src, dst, bytes));
}

#ifdef __cplusplus
}
#endif
#endif
