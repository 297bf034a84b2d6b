//===- meshplan-opt.cpp - mlir-opt for meshplan's dialects ----------------===//
//
// Registers exactly meshplan's dialects (and the upstream ones its tests use)
// and runs MLIR's standard opt driver; the lit suites drive it.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/DistDialect.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  meshplan::dist::registerDistPasses();
  mlir::DialectRegistry registry;
  registry.insert<meshplan::dist::DistDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::tensor::TensorDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "meshplan optimizer driver\n", registry));
}
