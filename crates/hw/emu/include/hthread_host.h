/* Host-side hthreads API (the ARM side of the MT-3000), emulator edition.
 *
 * Same names and argument order as the vendor's hthread_host.h, so a host
 * harness builds against either. In the emulator the device code is linked
 * into the same executable: hthread_dat_load only checks the image name and
 * hthread_group_create finds the `__global__` function by name. */
#ifndef MTSWARM_HTHREAD_HOST_H
#define MTSWARM_HTHREAD_HOST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HT_MEM_RO 0x1
#define HT_MEM_WO 0x2
#define HT_MEM_RW 0x3

int hthread_dev_open(int cluster_id);
int hthread_dev_close(int cluster_id);
int hthread_dat_load(int cluster_id, const char *dat_file);
int hthread_dat_unload(int cluster_id);
/* Cores of the cluster this process may use (the slice's cores). */
int hthread_get_avail_threads(int cluster_id);
/* Returns a thread-group id >= 0, or -1. Scalars come first in args,
 * then pointers; floating-point scalars are passed as their raw bits. */
int hthread_group_create(int cluster_id, int nthreads, const char *func_name, int nscalar,
                         int nptr, uint64_t *args);
int hthread_group_exec(int group_id);
int hthread_group_wait(int group_id);
int hthread_group_destroy(int group_id);
/* DDR memory shared by the host and the cluster's cores. */
void *hthread_malloc(int cluster_id, size_t bytes, int mem_flags);
void hthread_free(void *ptr);
/* A barrier id for group_barrier/core_barrier on the device, or -1. */
int hthread_barrier_create(int cluster_id);
int hthread_barrier_destroy(int barrier_id);

#ifdef __cplusplus
}
#endif
#endif
