/* The device's <stddef.h>. */
#ifndef MTSWARM_DEVICE_STDDEF_H
#define MTSWARM_DEVICE_STDDEF_H
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
#ifndef __cplusplus
typedef __WCHAR_TYPE__ wchar_t;
#endif
#define NULL ((void *)0)
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif
