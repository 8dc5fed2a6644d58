/* stencil2d's grid: NX x NY doubles. The defaults of tune.toml's [sizes];
 * a build passes them as -D. Read by host.c and kernel.c alike, and a
 * harness file (tune.toml `harness`), so the grid the kernel sweeps is the
 * one the harness checks. */
#ifndef NX
#define NX 1024
#endif
#ifndef NY
#define NY 1024
#endif
