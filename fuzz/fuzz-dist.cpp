//===- fuzz-dist.cpp - The dist dialect's parsers and verifiers -----------===//
//
// Input: MLIR text, as meshplan-opt reads it, with the dialects it registers
// (dist, func, arith, tensor). The module is parsed (the dist attributes'
// and ops' custom parsers: meshes, axis refs, layouts, view expressions,
// collectives) and verified (the ops' verifiers, which call core). A module
// that parses and verifies must print, in the custom and the generic form,
// as text that parses and verifies again and prints the same (the round
// trip meshplan-opt --verify-roundtrip checks). Errors go to a diagnostic
// handler and must say something.
//
//===----------------------------------------------------------------------===//

#include "FuzzSupport.h"

#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Parser/Parser.h"

#include "llvm/Support/raw_ostream.h"

using namespace meshplan::fuzz;

static std::string print(mlir::ModuleOp module, bool generic) {
  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::OpPrintingFlags flags;
  if (generic)
    flags.printGenericOpForm();
  module->print(os, flags);
  return text;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::DialectRegistry registry;
  registry.insert<meshplan::dist::DistDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::tensor::TensorDialect>();
  // One context per input: attributes and types are uniqued in it forever,
  // and no input may depend on what an earlier one left there.
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  std::string diagnostics;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &diag) {
    std::string message = diag.str();
    checkMessage(message, "a diagnostic");
    diagnostics += message + "\n";
    return mlir::success();
  });

  // NUL-terminated, as every buffer meshplan-opt and the pipeline parse
  // (files read by llvm::MemoryBuffer, std::string): MLIR's scanner of
  // dialect attribute bodies ("#dist.layout<...>") finds the end of the
  // buffer by its NUL, and parseSourceString does not copy libFuzzer's
  // unterminated bytes (it read past them: heap-buffer-overflow).
  std::string text(asText(data, size));
  auto module = mlir::parseSourceString<mlir::ModuleOp>(text, &context);
  if (!module)
    return 0;
  for (bool generic : {false, true}) {
    std::string printed = print(*module, generic);
    diagnostics.clear();
    auto again = mlir::parseSourceString<mlir::ModuleOp>(printed, &context);
    check(bool(again), std::string(generic ? "generic" : "custom") +
                           " form does not parse back:\n" + diagnostics +
                           "--- printed:\n" + printed);
    check(print(*again, generic) == printed,
          std::string(generic ? "generic" : "custom") +
              " form prints differently after a round trip:\n" + printed);
  }
  return 0;
}
