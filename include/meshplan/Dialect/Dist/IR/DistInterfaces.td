//===- DistInterfaces.td - layout rules -------------------*- tablegen -*-===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTINTERFACES_TD
#define MESHPLAN_DIALECT_DIST_IR_DISTINTERFACES_TD

include "mlir/IR/OpBase.td"

def Dist_LayoutRuleOpInterface : OpInterface<"LayoutRuleOpInterface"> {
  let cppNamespace = "::meshplan::dist";
  let description = [{
    How layouts flow through an op, forward and backward: given the layouts
    known so far for operands and results (null = unknown), the layouts the
    op needs for its operands and gives its results, or nullopt when nothing
    is known yet. Implementations call meshplan's core layout rules
    (Core/LayoutRules.h). Elementwise upstream ops (the `Elementwise` trait,
    e.g. every `arith` op on tensors) need no implementation:
    `dist-propagate-layouts` applies core's elementwise rule to them.
  }];
  let methods = [
    InterfaceMethod<
      "Layouts needed by the operands and given to the results.",
      "std::optional<::meshplan::RuleLayouts>", "inferLayouts",
      (ins "const ::meshplan::View &":$view,
           "::llvm::ArrayRef<const ::meshplan::Layout *>":$operands,
           "::llvm::ArrayRef<const ::meshplan::Layout *>":$results)>
  ];
}

#endif // MESHPLAN_DIALECT_DIST_IR_DISTINTERFACES_TD
