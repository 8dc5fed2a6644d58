/* The harness side of the emulator: what host.c links with when it is
 * built for the emulator (WebAssembly, wasi-libc).
 *
 * DDR buffers live in the harness's own memory; each is registered with
 * the runtime, which copies it into the device's memory when a group runs
 * and copies writable ones back when it ends. The other hthreads host
 * functions are the runtime's imports (module "env"). Standard output is
 * line-buffered and flushed before every launch, so the runtime's figures
 * of a launch follow everything the harness printed before it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "hthread_host.h"

__attribute__((import_module("mtswarm"), import_name("ddr_register"))) int
mtswarm_ddr_register(int cluster, void *ptr, size_t bytes, int flags);
__attribute__((import_module("mtswarm"), import_name("ddr_release"))) void
mtswarm_ddr_release(void *ptr);
__attribute__((import_module("mtswarm"), import_name("group_exec"))) int
mtswarm_group_exec(int group_id);

__attribute__((constructor)) static void mtswarm_line_buffered(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
}

void *hthread_malloc(int cluster_id, size_t bytes, int mem_flags) {
    size_t rounded = (bytes + 127) / 128 * 128;
    void *p = aligned_alloc(128, rounded ? rounded : 128);
    if (!p) return NULL;
    if (mtswarm_ddr_register(cluster_id, p, bytes, mem_flags) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

void hthread_free(void *ptr) {
    if (!ptr) return;
    mtswarm_ddr_release(ptr);
    free(ptr);
}

int hthread_group_exec(int group_id) {
    fflush(stdout);
    fflush(stderr);
    return mtswarm_group_exec(group_id);
}
