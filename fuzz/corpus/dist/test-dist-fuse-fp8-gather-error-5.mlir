func.func @unknown_key() attributes {dist.train_step, dist.float8 = {power_of_2 = true, power_of_two = true}} {
  return
}
