/* ONNX Runtime's PROBIT post transform, as its tree ensembles apply it to one target
   (ml_common.h ComputeProbit and ErfInv, float): sqrt(2) * erfinv(2v - 1) with Winitzki's
   approximation of erfinv, operation for operation in float32 with libm's logf and sqrtf and
   no contraction into fused multiply-adds, so the worker's value is ONNX Runtime's to the bit
   (tests/test_onnx.py). A value outside [0, 1] is NaN there as here. */
#ifndef SW_PROBIT_H
#define SW_PROBIT_H
#include <math.h>

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static float sw_ort_erfinv(float x) {
    const float sgn = x < 0 ? -1.0f : 1.0f;
    x = (1 - x) * (1 + x);
    const float lg = logf(x);
    const float v = 2 / ((float)3.14159265358979323846 * 0.147f) + 0.5f * lg;
    const float v2 = 1 / (0.147f) * lg;
    const float v3 = -v + sqrtf(v * v - v2);
    return sgn * sqrtf(v3);
}

static float sw_ort_probit(float val) {
    return (float)1.41421356237309504880 * sw_ort_erfinv(2 * val - 1);
}
#pragma GCC pop_options
#endif
