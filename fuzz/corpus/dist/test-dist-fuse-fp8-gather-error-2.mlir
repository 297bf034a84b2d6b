func.func @not_a_dictionary() attributes {dist.train_step, dist.float8 = true} {
  return
}
