/* dgemm's problem size: C (M x N) = A (M x K) * B (K x N). The defaults
 * of tune.toml's [sizes]; a build passes them as -D. Read by
 * host.c and kernel.c alike, and a harness file (tune.toml `harness`), so
 * the product the kernel computes is the one the harness checks. */
#ifndef M
#define M 512
#endif
#ifndef N
#define N 512
#endif
#ifndef K
#define K 512
#endif
