module attributes {dist.rank = 0 : i64} {
  dist.mesh @mesh ["dp" = 2, "tp" = 2]
  dist.comm @comm_mesh_dp on @mesh axes {"dp"} {color = 0 : i64, key = 0 : i64}
  func.func @train_step(%arg0: tensor<8x16xf32> {dist.param = "a.weight"}, %arg1: tensor<8x16xf32> {dist.param = "b.weight"}, %arg2: tensor<8x16xf32> {dist.state = "a.weight.exp_avg"}, %arg3: tensor<8x16xf32> {dist.state = "a.weight.exp_avg_sq"}, %arg4: tensor<8x16xf32> {dist.state = "b.weight.exp_avg"}, %arg5: tensor<8x16xf32> {dist.state = "b.weight.exp_avg_sq"}) attributes {dist.gradient_accumulation_steps = 1 : i64, dist.optimizer = {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, kind = "adamw", lr = 8.000000e-04 : f64, seed = 0 : i64, stochastic_rounding = false, weight_decay = 1.000000e-01 : f64}, dist.reshard_after_forward = true, dist.train_step, dist.trainer_axes = ["tp"]} {
    %0 = dist.all_gather %arg0 dim 0 over {"dp"} comm = @comm_mesh_dp group = [0, 2] {dist.bucket = 0 : i64, dist.id = 0 : i64, dist.stream = "comm.ag"} : tensor<8x16xf32> -> tensor<16x16xf32>
    %1 = dist.all_gather %arg1 dim 0 over {"dp"} comm = @comm_mesh_dp group = [0, 2] {dist.bucket = 0 : i64, dist.id = 1 : i64, dist.stream = "comm.ag"} : tensor<8x16xf32> -> tensor<16x16xf32>
    dist.compute forward "root"(%0, %1) flops = 0x4160000000000000 {dist.id = 2 : i64, dist.reshard_after_forward = false, dist.stream = "compute"} : tensor<16x16xf32>, tensor<16x16xf32>
    %2:2 = dist.compute backward "root"(%0, %1) flops = 0x4170000000000000 {dist.id = 3 : i64, dist.stream = "compute"} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>, tensor<16x16xf32>
    dist.free %0, %1 {dist.id = 4 : i64, dist.stream = "compute"} : tensor<16x16xf32>, tensor<16x16xf32>
    %3 = dist.reduce_scatter %2#0 dim 0 avg over {"dp"} comm = @comm_mesh_dp group = [0, 2] {dist.bucket = 1 : i64, dist.id = 5 : i64, dist.stream = "comm.rs"} : tensor<16x16xf32> -> tensor<8x16xf32>
    dist.free %2#0 {dist.after = array<i64: 5>, dist.id = 6 : i64, dist.stream = "compute"} : tensor<16x16xf32>
    %4 = dist.reduce_scatter %2#1 dim 0 avg over {"dp"} comm = @comm_mesh_dp group = [0, 2] {dist.bucket = 1 : i64, dist.id = 7 : i64, dist.stream = "comm.rs"} : tensor<16x16xf32> -> tensor<8x16xf32>
    dist.free %2#1 {dist.after = array<i64: 7>, dist.id = 8 : i64, dist.stream = "compute"} : tensor<16x16xf32>
    %new_param, %new_exp_avg, %new_exp_avg_sq = dist.adamw %arg0, %3, %arg2, %arg3 {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, dist.id = 9 : i64, dist.stream = "compute", eps = 1.000000e-08 : f64, lr = 8.000000e-04 : f64, seed = 0 : i64, tensor_id = 0 : i64, weight_decay = 1.000000e-01 : f64} : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
    dist.free %3 {dist.id = 10 : i64, dist.stream = "compute"} : tensor<8x16xf32>
    %new_param_0, %new_exp_avg_1, %new_exp_avg_sq_2 = dist.adamw %arg1, %4, %arg4, %arg5 {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, dist.id = 11 : i64, dist.stream = "compute", eps = 1.000000e-08 : f64, lr = 8.000000e-04 : f64, seed = 0 : i64, tensor_id = 1 : i64, weight_decay = 1.000000e-01 : f64} : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
    dist.free %4 {dist.id = 12 : i64, dist.stream = "compute"} : tensor<8x16xf32>
    return
  }
}
