//===- DiscardableAttrs.h - dist's discardable attributes -----------------===//
//
// The dist dialect's discardable attributes (`dist.train_step`,
// `dist.microbatch`, `dist.param`, ...) are declared once, in DistBase.td's
// `discardableAttrs`; ODS generates one accessor class per attribute,
// `DistDialect::<Name>AttrHelper`, whose `getNameStr()` is the only spelling
// of the name. The dialect verifies each attribute's type and values wherever
// it appears (DiscardableAttrs.cpp). This header adds what the verifiers and
// the passes both need: the readers of the two structured attributes, so that
// a pass and the verifier cannot disagree about what is valid.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISCARDABLEATTRS_H
#define MESHPLAN_DIALECT_DIST_IR_DISCARDABLEATTRS_H

#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/IR/Operation.h"
#include "mlir/Support/LLVM.h"

#include <cstdint>

namespace meshplan::dist {

/// The hyper-parameters of a `dist.optimizer` dictionary.
struct OptimizerHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  bool stochasticRounding = false;
  int64_t seed = 0;
};

/// Reads and checks `op`'s `dist.optimizer` value `raw` (kind "adamw"; f64
/// lr >= 0, beta1/beta2 in [0, 1), eps > 0, weight_decay >= 0; bool
/// stochastic_rounding; i64 seed); errors, on `op`, name the key.
mlir::FailureOr<OptimizerHyper> readOptimizerAttr(mlir::Operation *op,
                                                  mlir::Attribute raw);

/// Reads and checks `op`'s `dist.float8` value `raw`: `{power_of_2 = bool}`,
/// on a `dist.train_step` function. Returns power_of_2.
mlir::FailureOr<bool> readFloat8Attr(mlir::Operation *op, mlir::Attribute raw);

} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_IR_DISCARDABLEATTRS_H
