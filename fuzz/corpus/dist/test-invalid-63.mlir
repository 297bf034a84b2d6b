func.func @f(%w: tensor<8xf32>, %g: tensor<8xi32>) {
  dist.optimizer_step %w, %g : tensor<8xf32>, tensor<8xi32>
  return
}
