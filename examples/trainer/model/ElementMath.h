//===- ElementMath.h - The model's per-element math, CPU and GPU -*- C++
//-*-===//
//
// The per-element functions both ModelOps implementations apply (HostOps.cpp
// on the CPU, cuda/ModelKernels.cu on a GPU), so the two differ only in how
// they loop and sum, not in what they compute per element. Under nvcc the
// functions are __host__ __device__.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_MODEL_ELEMENTMATH_H
#define MESHPLAN_TRAINER_MODEL_ELEMENTMATH_H

#include <cmath>

#if defined(__CUDACC__)
#define MESHPLAN_MODEL_HD __host__ __device__ __forceinline__
#else
#define MESHPLAN_MODEL_HD inline
#endif

namespace meshplan::trainer::math {

MESHPLAN_MODEL_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// SwiGLU's gate: silu(a) g.
MESHPLAN_MODEL_HD float swiglu(float a, float g) { return a * sigmoid(a) * g; }

/// From the gradient du of silu(a) g: a := da, g := dg.
MESHPLAN_MODEL_HD void swigluBackward(float du, float &a, float &g) {
  float s = sigmoid(a);
  float silu = a * s;
  float dsilu = s * (1.0f + a * (1.0f - s));
  float da = du * g * dsilu;
  g = du * silu;
  a = da;
}

/// RoPE: rotates the pair (x0, x1) by the angle whose cosine and sine are
/// c and s.
MESHPLAN_MODEL_HD void rotate(float &x0, float &x1, float c, float s) {
  float a = x0, b = x1;
  x0 = a * c - b * s;
  x1 = a * s + b * c;
}

} // namespace meshplan::trainer::math

#endif // MESHPLAN_TRAINER_MODEL_ELEMENTMATH_H
