/* The hthreads runtime of the `host` backend: the host and device API on
 * the local CPU, each DSP core of a thread group a host thread, timed by
 * the wall clock.
 *
 * Kernels built for the host backend run natively, for real timing of code
 * that is not MT-3000-specific; nothing is modeled. The capacities of the
 * chip spec in $MTSWARM_SPEC (or the copy baked in at build time) still
 * hold, so a configuration that cannot run on the chip fails here too.
 * The emulator does not use this file: it runs device code as WebAssembly
 * (crates/hw/src/emu/machine). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compiler/m3000.h"
#include "hthread_device.h"
#include "hthread_host.h"

/* The spec baked in at build time (generated file), overridden by
 * $MTSWARM_SPEC at run time. */
extern const char mtswarm_spec_default[] __attribute__((weak));
/* Bounds of the `__gsm__` section, provided by the linker when it exists. */
extern char __start_mtswarm_gsm[] __attribute__((weak));
extern char __stop_mtswarm_gsm[] __attribute__((weak));

#define MAX_ARGS 16
#define MAX_GROUPS 64
#define MAX_BARRIERS 64
#define MAX_DDR_ALLOCS 4096

/* ---------------------------------------------------------------- errors */

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

/* Report an error the way the board's runtime would, and end the process:
 * one human line on stderr, one machine line on stdout. */
static void __attribute__((noreturn, format(printf, 2, 3)))
emu_fail(const char *kind, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&out_lock);
    fflush(stdout);
    fprintf(stderr, "mt3000-emu: %s\n", msg);
    fputs("MTSWARM_ERROR {\"kind\":", stdout);
    json_string(stdout, kind);
    fputs(",\"message\":", stdout);
    json_string(stdout, msg);
    fputs("}\n", stdout);
    fflush(stdout);
    fflush(stderr);
    _exit(3);
}

/* ------------------------------------------------------------------ spec */

struct spec {
    double clusters, cores_per_cluster, vector_lanes, fma_per_lane;
    double scalar_issue_slots, vector_issue_slots, clock_hz;
    double sm_bytes, sm_max_buffers, am_bytes, am_max_buffers, gsm_bytes;
    double ddr_bytes_per_cluster, ddr_bandwidth, dma_startup_cycles;
    double get_clk_cycles, vlddw_cycles;
    double vector_mem_slots, scalar_block_cycles, barrier_cycles, gsm_bandwidth;
    double ddr_latency_cycles, gsm_latency_cycles;
};

static const struct {
    const char *key;
    size_t offset;
} spec_keys[] = {
    {"clusters", offsetof(struct spec, clusters)},
    {"cores_per_cluster", offsetof(struct spec, cores_per_cluster)},
    {"vector_lanes", offsetof(struct spec, vector_lanes)},
    {"fma_per_lane", offsetof(struct spec, fma_per_lane)},
    {"scalar_issue_slots", offsetof(struct spec, scalar_issue_slots)},
    {"vector_issue_slots", offsetof(struct spec, vector_issue_slots)},
    {"clock_hz", offsetof(struct spec, clock_hz)},
    {"sm_bytes", offsetof(struct spec, sm_bytes)},
    {"sm_max_buffers", offsetof(struct spec, sm_max_buffers)},
    {"am_bytes", offsetof(struct spec, am_bytes)},
    {"am_max_buffers", offsetof(struct spec, am_max_buffers)},
    {"gsm_bytes", offsetof(struct spec, gsm_bytes)},
    {"ddr_bytes_per_cluster", offsetof(struct spec, ddr_bytes_per_cluster)},
    {"ddr_bandwidth", offsetof(struct spec, ddr_bandwidth)},
    {"dma_startup_cycles", offsetof(struct spec, dma_startup_cycles)},
    {"latency.get_clk", offsetof(struct spec, get_clk_cycles)},
    {"latency.vlddw", offsetof(struct spec, vlddw_cycles)},
    {"model.vector_mem_slots", offsetof(struct spec, vector_mem_slots)},
    {"model.scalar_block_cycles", offsetof(struct spec, scalar_block_cycles)},
    {"model.barrier_cycles", offsetof(struct spec, barrier_cycles)},
    {"model.gsm_bandwidth", offsetof(struct spec, gsm_bandwidth)},
    {"model.ddr_latency_cycles", offsetof(struct spec, ddr_latency_cycles)},
    {"model.gsm_latency_cycles", offsetof(struct spec, gsm_latency_cycles)},
};
#define N_SPEC_KEYS (sizeof spec_keys / sizeof spec_keys[0])

static struct spec S;
static pthread_once_t spec_once = PTHREAD_ONCE_INIT;

/* Format: `key=value;key=value;...` (written by the Rust side). */
static void parse_spec(const char *text, const char *origin) {
    int seen[N_SPEC_KEYS] = {0};
    const char *p = text;
    while (*p) {
        while (*p == ';' || *p == ' ' || *p == '\n') p++;
        if (!*p) break;
        const char *eq = strchr(p, '=');
        if (!eq) emu_fail("config", "chip spec (%s): expected key=value near '%.40s'", origin, p);
        size_t klen = (size_t)(eq - p);
        char *end = NULL;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || errno != 0)
            emu_fail("config", "chip spec (%s): bad number for '%.*s'", origin, (int)klen, p);
        for (size_t i = 0; i < N_SPEC_KEYS; i++) {
            if (strlen(spec_keys[i].key) == klen && strncmp(spec_keys[i].key, p, klen) == 0) {
                *(double *)((char *)&S + spec_keys[i].offset) = v;
                seen[i] = 1;
            }
        }
        p = end;
    }
    for (size_t i = 0; i < N_SPEC_KEYS; i++)
        if (!seen[i]) emu_fail("config", "chip spec (%s): missing key '%s'", origin, spec_keys[i].key);
    if (S.clusters < 1 || S.cores_per_cluster < 1 || S.fma_per_lane <= 0 || S.clock_hz <= 0 ||
        S.vector_mem_slots <= 0 || S.ddr_bandwidth <= 0 || S.gsm_bandwidth <= 0 ||
        S.vector_lanes < 1)
        emu_fail("config", "chip spec (%s): counts, clock and bandwidths must be positive", origin);
}

static void load_spec(void) {
    const char *env = getenv("MTSWARM_SPEC");
    if (env && *env) {
        parse_spec(env, "$MTSWARM_SPEC");
    } else if (mtswarm_spec_default) {
        parse_spec(mtswarm_spec_default, "built-in");
    } else {
        emu_fail("config", "no chip spec: set MTSWARM_SPEC or build through mtswarm");
    }
}

static const struct spec *spec(void) {
    pthread_once(&spec_once, load_spec);
    return &S;
}

/* ------------------------------------------------------- memory per core */

struct buffer {
    size_t offset, bytes;
};

/* A per-core scratchpad (AM or SM) with a first-fit allocator whose buffer
 * count and capacity are the spec's limits. */
struct scratch {
    char *base;
    size_t capacity;
    int max_buffers;
    int count;
    size_t in_use;
    struct buffer *bufs; /* sorted by offset */
};

struct core_mem {
    struct scratch am, sm;
};

struct core_state;

struct group {
    int used;
    int cluster;
    int nthreads;
    int executing;
    void *fn;
    char name[128];
    uint64_t args[MAX_ARGS];
    pthread_t *threads;
    struct core_state *cores;
    struct timespec wall_start;
};

struct core_state {
    int id;
    struct group *group;
    struct core_mem *mem;
    unsigned int next_chan;
};

struct cluster {
    int open;
    int dat_loaded;
    int busy;
    size_t ddr_in_use;
    struct core_mem *cores; /* cores_per_cluster entries, arenas on first use */
};

struct ddr_alloc {
    void *ptr;
    size_t bytes;
    int cluster;
    int flags;
};

struct barrier {
    int used;
    int cluster;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int arrived, expected;
    unsigned long generation;
};

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cluster *clusters;
static struct group groups[MAX_GROUPS];
static struct barrier barriers[MAX_BARRIERS];
static struct ddr_alloc ddr_allocs[MAX_DDR_ALLOCS];
static __thread struct core_state *current_core;

static struct cluster *cluster_of(int cluster_id, const char *who) {
    const struct spec *sp = spec();
    if (cluster_id < 0 || cluster_id >= (int)sp->clusters)
        emu_fail("usage", "%s: cluster %d does not exist (clusters 0..%d)", who, cluster_id,
                 (int)sp->clusters - 1);
    if (!clusters) {
        clusters = calloc((size_t)sp->clusters, sizeof *clusters);
        if (!clusters) emu_fail("launch", "out of host memory");
    }
    return &clusters[cluster_id];
}

static void scratch_init(struct scratch *s, size_t capacity, int max_buffers) {
    s->base = aligned_alloc(MTSWARM_VECTOR_BYTES,
                            (capacity + MTSWARM_VECTOR_BYTES - 1) / MTSWARM_VECTOR_BYTES *
                                MTSWARM_VECTOR_BYTES);
    s->bufs = calloc((size_t)max_buffers + 1, sizeof *s->bufs);
    if (!s->base || !s->bufs) emu_fail("launch", "out of host memory for core scratchpads");
    memset(s->base, 0, capacity);
    s->capacity = capacity;
    s->max_buffers = max_buffers;
    s->count = 0;
    s->in_use = 0;
}

static void *scratch_alloc(struct scratch *s, size_t bytes, const char *level, const char *fn,
                           int core) {
    size_t rounded = (bytes + MTSWARM_VECTOR_BYTES - 1) / MTSWARM_VECTOR_BYTES * MTSWARM_VECTOR_BYTES;
    if (bytes == 0) emu_fail("usage", "%s(0) on core %d: zero-byte buffer", fn, core);
    if (s->count >= s->max_buffers)
        emu_fail("capacity", "%s(%zu) on core %d: %s buffer limit exceeded (%d %s buffers per core)",
                 fn, bytes, core, level, s->max_buffers, fn);
    if (rounded > s->capacity - s->in_use)
        emu_fail("capacity", "%s(%zu) on core %d: %s capacity exceeded (%zu bytes per core, %zu in use)",
                 fn, bytes, core, level, s->capacity, s->in_use);
    size_t prev_end = 0;
    int slot = s->count;
    for (int i = 0; i <= s->count; i++) {
        size_t next_start = i < s->count ? s->bufs[i].offset : s->capacity;
        if (next_start - prev_end >= rounded) {
            slot = i;
            break;
        }
        if (i == s->count)
            emu_fail("capacity",
                     "%s(%zu) on core %d: %s capacity exceeded (%zu bytes per core, %zu in use, "
                     "no contiguous free range)",
                     fn, bytes, core, level, s->capacity, s->in_use);
        prev_end = s->bufs[i].offset + s->bufs[i].bytes;
    }
    memmove(&s->bufs[slot + 1], &s->bufs[slot], (size_t)(s->count - slot) * sizeof *s->bufs);
    s->bufs[slot].offset = prev_end;
    s->bufs[slot].bytes = rounded;
    s->count++;
    s->in_use += rounded;
    return s->base + prev_end;
}

static void scratch_free(struct scratch *s, void *ptr, const char *fn, int core) {
    if (!ptr) return;
    for (int i = 0; i < s->count; i++) {
        if (s->base + s->bufs[i].offset == (char *)ptr) {
            s->in_use -= s->bufs[i].bytes;
            memmove(&s->bufs[i], &s->bufs[i + 1], (size_t)(s->count - i - 1) * sizeof *s->bufs);
            s->count--;
            return;
        }
    }
    emu_fail("usage", "%s(%p) on core %d: not a live buffer of this core", fn, ptr, core);
}

static struct core_state *need_core(const char *who) {
    struct core_state *cs = current_core;
    if (!cs) emu_fail("usage", "%s called outside a device thread", who);
    return cs;
}


/* ------------------------------------------------------------- host API */

int hthread_dev_open(int cluster_id) {
    const struct spec *sp = spec();
    pthread_mutex_lock(&api_lock);
    struct cluster *cl = cluster_of(cluster_id, "hthread_dev_open");
    size_t gsm = (size_t)(__stop_mtswarm_gsm - __start_mtswarm_gsm);
    if (__start_mtswarm_gsm && (double)gsm > sp->gsm_bytes)
        emu_fail("capacity",
                 "hthread_dev_open(%d): GSM capacity exceeded (%.0f bytes per cluster, %zu bytes "
                 "of __gsm__ arrays)",
                 cluster_id, sp->gsm_bytes, gsm);
    if (!cl->cores) {
        cl->cores = calloc((size_t)sp->cores_per_cluster, sizeof *cl->cores);
        if (!cl->cores) emu_fail("launch", "out of host memory");
    }
    cl->open = 1;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_dev_close(int cluster_id) {
    pthread_mutex_lock(&api_lock);
    struct cluster *cl = cluster_of(cluster_id, "hthread_dev_close");
    if (cl->busy) emu_fail("usage", "hthread_dev_close(%d): a thread group is still running", cluster_id);
    cl->open = 0;
    cl->dat_loaded = 0;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_dat_load(int cluster_id, const char *dat_file) {
    pthread_mutex_lock(&api_lock);
    struct cluster *cl = cluster_of(cluster_id, "hthread_dat_load");
    if (!cl->open) emu_fail("usage", "hthread_dat_load(%d): device not opened", cluster_id);
    size_t len = dat_file ? strlen(dat_file) : 0;
    if (len < 5 || strcmp(dat_file + len - 4, ".dat") != 0)
        emu_fail("usage", "hthread_dat_load(%d, \"%s\"): expected a device image name ending in .dat",
                 cluster_id, dat_file ? dat_file : "(null)");
    cl->dat_loaded = 1;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_dat_unload(int cluster_id) {
    pthread_mutex_lock(&api_lock);
    cluster_of(cluster_id, "hthread_dat_unload")->dat_loaded = 0;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_get_avail_threads(int cluster_id) {
    const struct spec *sp = spec();
    cluster_of(cluster_id, "hthread_get_avail_threads");
    const char *env = getenv("MTSWARM_CORES");
    if (!env || !*env) return (int)sp->cores_per_cluster;
    char *end = NULL;
    long n = strtol(env, &end, 10);
    if (end == env || *end || n < 1)
        emu_fail("config", "MTSWARM_CORES must be a positive integer, got '%s'", env);
    if (n > (long)sp->cores_per_cluster)
        emu_fail("capacity", "MTSWARM_CORES=%ld: a cluster has %d cores (cores_per_cluster)", n,
                 (int)sp->cores_per_cluster);
    return (int)n;
}

int hthread_group_create(int cluster_id, int nthreads, const char *func_name, int nscalar,
                         int nptr, uint64_t *args) {
    const struct spec *sp = spec();
    int avail = hthread_get_avail_threads(cluster_id);
    pthread_mutex_lock(&api_lock);
    struct cluster *cl = cluster_of(cluster_id, "hthread_group_create");
    if (!cl->open || !cl->dat_loaded)
        emu_fail("usage", "hthread_group_create(%d): open the device and load the kernel image first",
                 cluster_id);
    if (nthreads < 1) emu_fail("usage", "hthread_group_create: %d threads requested", nthreads);
    if (nthreads > (int)sp->cores_per_cluster)
        emu_fail("capacity",
                 "hthread_group_create(%d, %d): a cluster has %d cores (cores_per_cluster)",
                 cluster_id, nthreads, (int)sp->cores_per_cluster);
    if (nthreads > avail)
        emu_fail("capacity", "hthread_group_create(%d, %d): the slice provides %d cores", cluster_id,
                 nthreads, avail);
    if (nscalar < 0 || nptr < 0 || nscalar + nptr > MAX_ARGS)
        emu_fail("usage", "hthread_group_create: %d scalar + %d pointer arguments (at most %d)",
                 nscalar, nptr, MAX_ARGS);
    if (!func_name || strlen(func_name) >= sizeof groups[0].name)
        emu_fail("usage", "hthread_group_create: bad kernel function name");
    void *fn = dlsym(RTLD_DEFAULT, func_name);
    if (!fn)
        emu_fail("launch",
                 "hthread_group_create: kernel function '%s' not found in the device image "
                 "(declare it __global__)",
                 func_name);
    int id = -1;
    for (int i = 0; i < MAX_GROUPS; i++)
        if (!groups[i].used) {
            id = i;
            break;
        }
    if (id < 0) emu_fail("usage", "hthread_group_create: more than %d live thread groups", MAX_GROUPS);
    struct group *g = &groups[id];
    memset(g, 0, sizeof *g);
    g->used = 1;
    g->cluster = cluster_id;
    g->nthreads = nthreads;
    g->fn = fn;
    snprintf(g->name, sizeof g->name, "%s", func_name);
    for (int i = 0; i < nscalar + nptr; i++) g->args[i] = args[i];
    pthread_mutex_unlock(&api_lock);
    return id;
}

typedef void (*kernel_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t);

static void *core_main(void *arg) {
    struct core_state *cs = arg;
    struct group *g = cs->group;
    current_core = cs;
    uint64_t *a = g->args;
    ((kernel_fn)g->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                       a[12], a[13], a[14], a[15]);
    /* Buffers do not outlive the kernel, as with a fresh image on the board. */
    cs->mem->am.count = 0;
    cs->mem->am.in_use = 0;
    cs->mem->sm.count = 0;
    cs->mem->sm.in_use = 0;
    current_core = NULL;
    return NULL;
}

static struct group *group_of(int id, const char *who) {
    if (id < 0 || id >= MAX_GROUPS || !groups[id].used)
        emu_fail("usage", "%s(%d): no such thread group", who, id);
    return &groups[id];
}

int hthread_group_exec(int group_id) {
    const struct spec *sp = spec();
    pthread_mutex_lock(&api_lock);
    struct group *g = group_of(group_id, "hthread_group_exec");
    struct cluster *cl = &clusters[g->cluster];
    if (g->executing || cl->busy)
        emu_fail("usage", "hthread_group_exec(%d): cluster %d is already running a group", group_id,
                 g->cluster);
    g->threads = calloc((size_t)g->nthreads, sizeof *g->threads);
    g->cores = calloc((size_t)g->nthreads, sizeof *g->cores);
    if (!g->threads || !g->cores) emu_fail("launch", "out of host memory");
    for (int i = 0; i < g->nthreads; i++) {
        struct core_mem *m = &cl->cores[i];
        if (!m->am.base) {
            scratch_init(&m->am, (size_t)sp->am_bytes, (int)sp->am_max_buffers);
            scratch_init(&m->sm, (size_t)sp->sm_bytes, (int)sp->sm_max_buffers);
        }
        g->cores[i].id = i;
        g->cores[i].group = g;
        g->cores[i].mem = m;
    }
    g->executing = 1;
    cl->busy = 1;
    clock_gettime(CLOCK_MONOTONIC, &g->wall_start);
    for (int i = 0; i < g->nthreads; i++)
        if (pthread_create(&g->threads[i], NULL, core_main, &g->cores[i]) != 0)
            emu_fail("launch", "hthread_group_exec(%d): cannot start core thread %d", group_id, i);
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_group_wait(int group_id) {
    struct group *g = group_of(group_id, "hthread_group_wait");
    if (!g->executing) emu_fail("usage", "hthread_group_wait(%d): group is not running", group_id);
    for (int i = 0; i < g->nthreads; i++) pthread_join(g->threads[i], NULL);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    double wall = (double)(end.tv_sec - g->wall_start.tv_sec) +
                  (double)(end.tv_nsec - g->wall_start.tv_nsec) * 1e-9;
    pthread_mutex_lock(&out_lock);
    printf("MTSWARM_EMU {\"kernel\":");
    json_string(stdout, g->name);
    printf(",\"cluster\":%d,\"threads\":%d,\"modeled\":false,\"seconds\":%.9e,\"wall_seconds\":%.9e}\n",
           g->cluster, g->nthreads, wall, wall);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    pthread_mutex_lock(&api_lock);
    free(g->threads);
    free(g->cores);
    g->threads = NULL;
    g->cores = NULL;
    g->executing = 0;
    clusters[g->cluster].busy = 0;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

int hthread_group_destroy(int group_id) {
    pthread_mutex_lock(&api_lock);
    struct group *g = group_of(group_id, "hthread_group_destroy");
    if (g->executing) emu_fail("usage", "hthread_group_destroy(%d): group is still running", group_id);
    g->used = 0;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

void *hthread_malloc(int cluster_id, size_t bytes, int mem_flags) {
    const struct spec *sp = spec();
    pthread_mutex_lock(&api_lock);
    struct cluster *cl = cluster_of(cluster_id, "hthread_malloc");
    if (mem_flags < HT_MEM_RO || mem_flags > HT_MEM_RW)
        emu_fail("usage", "hthread_malloc: flags must be HT_MEM_RO, HT_MEM_WO or HT_MEM_RW");
    if ((double)(cl->ddr_in_use + bytes) > sp->ddr_bytes_per_cluster)
        emu_fail("capacity",
                 "hthread_malloc(%d, %zu): DDR capacity exceeded (%.0f bytes per cluster, %zu in use)",
                 cluster_id, bytes, sp->ddr_bytes_per_cluster, cl->ddr_in_use);
    int slot = -1;
    for (int i = 0; i < MAX_DDR_ALLOCS; i++)
        if (!ddr_allocs[i].ptr) {
            slot = i;
            break;
        }
    if (slot < 0) emu_fail("usage", "hthread_malloc: more than %d live allocations", MAX_DDR_ALLOCS);
    size_t rounded = (bytes + MTSWARM_VECTOR_BYTES - 1) / MTSWARM_VECTOR_BYTES * MTSWARM_VECTOR_BYTES;
    void *p = aligned_alloc(MTSWARM_VECTOR_BYTES, rounded ? rounded : MTSWARM_VECTOR_BYTES);
    if (!p) {
        pthread_mutex_unlock(&api_lock);
        return NULL;
    }
    ddr_allocs[slot] = (struct ddr_alloc){p, bytes, cluster_id, mem_flags};
    cl->ddr_in_use += bytes;
    pthread_mutex_unlock(&api_lock);
    return p;
}

void hthread_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&api_lock);
    for (int i = 0; i < MAX_DDR_ALLOCS; i++) {
        if (ddr_allocs[i].ptr == ptr) {
            clusters[ddr_allocs[i].cluster].ddr_in_use -= ddr_allocs[i].bytes;
            ddr_allocs[i].ptr = NULL;
            free(ptr);
            pthread_mutex_unlock(&api_lock);
            return;
        }
    }
    emu_fail("usage", "hthread_free(%p): not an hthread_malloc pointer", ptr);
}

int hthread_barrier_create(int cluster_id) {
    pthread_mutex_lock(&api_lock);
    cluster_of(cluster_id, "hthread_barrier_create");
    for (int i = 0; i < MAX_BARRIERS; i++) {
        if (!barriers[i].used) {
            struct barrier *b = &barriers[i];
            memset(b, 0, sizeof *b);
            b->used = 1;
            b->cluster = cluster_id;
            pthread_mutex_init(&b->lock, NULL);
            pthread_cond_init(&b->cv, NULL);
            pthread_mutex_unlock(&api_lock);
            return i;
        }
    }
    pthread_mutex_unlock(&api_lock);
    return -1;
}

int hthread_barrier_destroy(int barrier_id) {
    pthread_mutex_lock(&api_lock);
    if (barrier_id >= 0 && barrier_id < MAX_BARRIERS) barriers[barrier_id].used = 0;
    pthread_mutex_unlock(&api_lock);
    return 0;
}

/* ----------------------------------------------------------- device API */

int get_thread_id(void) { return need_core("get_thread_id")->id; }
int get_core_id(void) { return need_core("get_core_id")->id; }
int get_group_size(void) { return need_core("get_group_size")->group->nthreads; }

static void barrier_sync(int barrier_id, int ncores, const char *who) {
    struct core_state *cs = need_core(who);
    if (barrier_id < 0 || barrier_id >= MAX_BARRIERS || !barriers[barrier_id].used)
        emu_fail("usage", "%s(%d) on core %d: no such barrier (use hthread_barrier_create)", who,
                 barrier_id, cs->id);
    if (ncores < 1 || ncores > cs->group->nthreads)
        emu_fail("usage", "%s(%d, %d) on core %d: the group has %d cores", who, barrier_id, ncores,
                 cs->id, cs->group->nthreads);
    struct barrier *b = &barriers[barrier_id];
    pthread_mutex_lock(&b->lock);
    if (b->arrived == 0) {
        b->expected = ncores;
    } else if (b->expected != ncores) {
        emu_fail("usage", "%s(%d) on core %d: cores disagree on the participant count (%d vs %d)",
                 who, barrier_id, cs->id, ncores, b->expected);
    }
    b->arrived++;
    if (b->arrived == b->expected) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cv);
    } else {
        unsigned long gen = b->generation;
        while (gen == b->generation) pthread_cond_wait(&b->cv, &b->lock);
    }
    pthread_mutex_unlock(&b->lock);
}

void group_barrier(int barrier_id) {
    struct core_state *cs = need_core("group_barrier");
    barrier_sync(barrier_id, cs->group->nthreads, "group_barrier");
}

void core_barrier(int barrier_id, int ncores) { barrier_sync(barrier_id, ncores, "core_barrier"); }

int hthread_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    int n = vfprintf(stderr, fmt, ap);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
    return n;
}

unsigned long get_clk(void) {
    need_core("get_clk");
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long)t.tv_sec * 1000000000ul + (unsigned long)t.tv_nsec;
}

void *scalar_malloc(unsigned int bytes) {
    struct core_state *cs = need_core("scalar_malloc");
    return scratch_alloc(&cs->mem->sm, bytes, "SM", "scalar_malloc", cs->id);
}

void scalar_free(void *ptr) {
    struct core_state *cs = need_core("scalar_free");
    scratch_free(&cs->mem->sm, ptr, "scalar_free", cs->id);
}

void *vector_malloc(unsigned int bytes) {
    struct core_state *cs = need_core("vector_malloc");
    return scratch_alloc(&cs->mem->am, bytes, "AM", "vector_malloc", cs->id);
}

void vector_free(void *ptr) {
    struct core_state *cs = need_core("vector_free");
    scratch_free(&cs->mem->am, ptr, "vector_free", cs->id);
}

unsigned int dma_p2p(const void *src, unsigned long src_rows, unsigned int src_row_bytes,
                     int src_row_gap, void *dst, unsigned long dst_rows, unsigned int dst_row_bytes,
                     int dst_row_gap, int row_syn, unsigned int synmask) {
    (void)row_syn;
    (void)synmask;
    struct core_state *cs = need_core("dma_p2p");
    if (!src || !dst || src_rows == 0 || dst_rows == 0 || src_row_bytes == 0 || dst_row_bytes == 0 ||
        src_row_gap < 0 || dst_row_gap < 0)
        emu_fail("usage",
                 "dma_p2p on core %d: null pointer, empty rows or negative row gap (src %p %lux%u "
                 "gap %d, dst %p %lux%u gap %d)",
                 cs->id, src, src_rows, src_row_bytes, src_row_gap, dst, dst_rows, dst_row_bytes,
                 dst_row_gap);
    uint64_t src_total = (uint64_t)src_rows * src_row_bytes;
    uint64_t dst_total = (uint64_t)dst_rows * dst_row_bytes;
    if (src_total != dst_total)
        emu_fail("usage", "dma_p2p on core %d: source has %llu bytes, destination %llu", cs->id,
                 (unsigned long long)src_total, (unsigned long long)dst_total);
    const char *s = src;
    char *d = dst;
    uint64_t s_left = src_row_bytes, d_left = dst_row_bytes, remaining = src_total;
    while (remaining) {
        uint64_t n = s_left < d_left ? s_left : d_left;
        memmove(d, s, n);
        s += n;
        d += n;
        s_left -= n;
        d_left -= n;
        remaining -= n;
        if (s_left == 0) {
            s += src_row_gap;
            s_left = src_row_bytes;
        }
        if (d_left == 0) {
            d += dst_row_gap;
            d_left = dst_row_bytes;
        }
    }
    return cs->next_chan++;
}

void dma_wait(unsigned int channel) {
    struct core_state *cs = need_core("dma_wait");
    if (channel >= cs->next_chan)
        emu_fail("usage", "dma_wait(%u) on core %d: no such transfer", channel, cs->id);
}

int dma_query(unsigned int channel) {
    struct core_state *cs = need_core("dma_query");
    if (channel >= cs->next_chan)
        emu_fail("usage", "dma_query(%u) on core %d: no such transfer", channel, cs->id);
    return 1;
}
