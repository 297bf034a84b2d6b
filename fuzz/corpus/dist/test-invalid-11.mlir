func.func private @f(tensor<8xf32, #dist.layout<@m, [{}], partial(mean) = {"dp"}>>)
