/* The device's <stdbool.h>. */
#ifndef MTSWARM_DEVICE_STDBOOL_H
#define MTSWARM_DEVICE_STDBOOL_H
#ifndef __cplusplus
#define bool _Bool
#define true 1
#define false 0
#endif
#endif
