dist.mesh @world ["dp" = 4, "tp" = 2]
func.func @sr_adamw(%p: tensor<1024x256xbf16> {dist.layout = #dist.layout<@world, [{"dp"}, {"tp"}]>},
                    %g: tensor<1024x256xf32>, %m: tensor<1024x256xf32>,
                    %rand: tensor<1024x256xi32>) -> tensor<1024x128xf32> {
  %beta = arith.constant dense<0.9> : tensor<1024x256xf32>
  %lr = arith.constant dense<1.0e-3> : tensor<1024x256xf32>
  %low_mask = arith.constant dense<65535> : tensor<1024x256xi32>
  %high_mask = arith.constant dense<-65536> : tensor<1024x256xi32>
  %one_ulp = arith.constant dense<65536> : tensor<1024x256xi32>
  %pf = arith.extf %p : tensor<1024x256xbf16> to tensor<1024x256xf32>
  %m1 = arith.mulf %m, %beta : tensor<1024x256xf32>
  %m2 = arith.addf %m1, %g : tensor<1024x256xf32>
  %step = arith.mulf %m2, %lr : tensor<1024x256xf32>
  %new = arith.subf %pf, %step : tensor<1024x256xf32>
  %bits = arith.bitcast %new : tensor<1024x256xf32> to tensor<1024x256xi32>
  %low = arith.andi %bits, %low_mask : tensor<1024x256xi32>
  %high = arith.andi %bits, %high_mask : tensor<1024x256xi32>
  %up = arith.addi %high, %one_ulp : tensor<1024x256xi32>
  %round_up = arith.cmpi ult, %rand, %low : tensor<1024x256xi32>
  %rounded = arith.select %round_up, %up, %high : tensor<1024x256xi1>, tensor<1024x256xi32>
  %f = arith.bitcast %rounded : tensor<1024x256xi32> to tensor<1024x256xf32>
  %out = arith.truncf %f : tensor<1024x256xf32> to tensor<1024x256xbf16>
  %packed = dist.bitcast %out : tensor<1024x256xbf16> -> tensor<1024x128xf32>
  return %packed : tensor<1024x128xf32>
}
