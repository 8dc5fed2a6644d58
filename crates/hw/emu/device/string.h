/* The device's <string.h>: the memory functions the runtime provides.
 * Their bytes are charged by every memory level each range touches. */
#ifndef MTSWARM_DEVICE_STRING_H
#define MTSWARM_DEVICE_STRING_H
#include <stddef.h>
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int value, size_t n);
#endif
