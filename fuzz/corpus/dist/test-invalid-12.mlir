func.func private @f(tensor<8xf32, #dist.layout<@m, [{"x":(0)2}]>>)
