func.func @no_power_of_2() attributes {dist.train_step, dist.float8 = {}} {
  return
}
