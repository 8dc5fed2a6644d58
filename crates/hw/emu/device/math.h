/* The device's <math.h>: the scalar library subset (slib3000) the runtime
 * provides. A call costs a fixed number of cycles; sqrt, fabs, floor and
 * ceil usually compile to single instructions. */
#ifndef MTSWARM_DEVICE_MATH_H
#define MTSWARM_DEVICE_MATH_H
#define NAN __builtin_nan("")
#define INFINITY __builtin_inf()
#define HUGE_VAL __builtin_huge_val()
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)
#define signbit(x) __builtin_signbit(x)
double sqrt(double);
float sqrtf(float);
double fabs(double);
float fabsf(float);
double floor(double);
float floorf(float);
double ceil(double);
float ceilf(float);
double exp(double);
float expf(float);
double log(double);
float logf(float);
double pow(double, double);
float powf(float, float);
double sin(double);
float sinf(float);
double cos(double);
float cosf(float);
double tanh(double);
float tanhf(float);
double fmin(double, double);
float fminf(float, float);
double fmax(double, double);
float fmaxf(float, float);
double fma(double, double, double);
float fmaf(float, float, float);
#endif
