// RUN: not %meshplan-opt %s --dist-specialize-rank 2>&1 | FileCheck %s
// CHECK: error: dist-specialize-rank needs rank=N (N >= 0)
dist.mesh @m ["dp" = 2]
