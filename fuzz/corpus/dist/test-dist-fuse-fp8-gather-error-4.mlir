func.func @power_of_2_not_bool() attributes {dist.train_step, dist.float8 = {power_of_2 = 1 : i64}} {
  return
}
