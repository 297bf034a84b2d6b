//===- DistDialect.cpp - The dist dialect ---------------------------------===//

#include "meshplan/Dialect/Dist/IR/DistDialect.h"
#include "meshplan/Dialect/Dist/IR/CoreBridge.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace meshplan::dist;

#include "meshplan/Dialect/Dist/IR/DistDialect.cpp.inc"

void DistDialect::initialize() {
  coreCache = makeCoreCache();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "meshplan/Dialect/Dist/IR/DistOps.cpp.inc"
      >();
}
