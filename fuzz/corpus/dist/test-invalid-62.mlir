func.func @f(%w: tensor<8x4xf32>, %g: tensor<4x8xf32>) {
  dist.optimizer_step %w, %g : tensor<8x4xf32>, tensor<4x8xf32>
  return
}
