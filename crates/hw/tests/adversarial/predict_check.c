/* Class 6, a predictable answer check: the dgemm harness validates C by
 * Freivalds' projection C x = A (B x). When x comes from the same random
 * stream as A and B, the kernel can recover the stream's state from two
 * elements of A (splitmix64 is invertible), predict x, and write the rank-1
 * C = (A B x) x^T / (x . x), which passes the check in O(n^2) work instead
 * of the product's O(n^3).
 * Expected: valid against a harness that draws x with the inputs
 * (predictable_check_host.c: the attack works), invalid against the real
 * harness, which draws x after the kernel ran. */
#include <stdint.h>

#include <hthread_device.h>

#define GOLDEN 0x9E3779B97F4A7C15ull
#define MUL1 0xBF58476D1CE4E5B9ull
#define MUL2 0x94D049BB133111EBull

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * MUL1;
    z = (z ^ (z >> 27)) * MUL2;
    return z ^ (z >> 31);
}

/* The inverse of multiplying by an odd constant modulo 2^64. */
static uint64_t inverse(uint64_t a) {
    uint64_t x = a;
    for (int i = 0; i < 6; i++) x *= 2 - a * x;
    return x;
}

/* The inverse of z = x ^ (x >> k). */
static uint64_t unshift(uint64_t z, int k) {
    uint64_t x = z;
    for (int i = 0; i < 64 / k + 1; i++) x = z ^ (x >> k);
    return x;
}

static uint64_t unmix(uint64_t z) {
    z = unshift(z, 31);
    z *= inverse(MUL2);
    z = unshift(z, 27);
    z *= inverse(MUL1);
    return unshift(z, 30);
}

/* The 53 bits a uniform draw in [lo, lo + 1) kept of its 64-bit output. */
static uint64_t top_bits(double v, double lo) {
    return (uint64_t)((v - lo) * 9007199254740992.0);
}

__global__ void dgemm_kernel(uint64_t barrier, double *A, double *B, double *C) {
    (void)barrier;
    if (get_thread_id() != 0) return;
    uint64_t first = top_bits(A[0], -0.5), second = top_bits(A[1], -0.5);
    uint64_t state = 0;
    for (uint64_t low = 0; low < 2048; low++) {
        uint64_t s = unmix((first << 11) | low);
        if ((mix(s + GOLDEN) >> 11) == second) {
            state = s;
            break;
        }
    }
    /* The state after the last element of B; x is drawn next. */
    state += ((uint64_t)M * K + (uint64_t)K * N - 1) * GOLDEN;
    double *x = scalar_malloc(N * sizeof(double));
    double *bx = scalar_malloc(K * sizeof(double));
    double xx = 0.0;
    for (int j = 0; j < N; j++) {
        state += GOLDEN;
        x[j] = 0.5 + (double)(mix(state) >> 11) * (1.0 / 9007199254740992.0);
        xx += x[j] * x[j];
    }
    for (int k = 0; k < K; k++) {
        double s = 0.0;
        for (int j = 0; j < N; j++) s += B[k * N + j] * x[j];
        bx[k] = s;
    }
    for (int i = 0; i < M; i++) {
        double y = 0.0;
        for (int k = 0; k < K; k++) y += A[i * K + k] * bx[k];
        for (int j = 0; j < N; j++) C[i * N + j] = y * x[j] / xx;
    }
}
