dist.compute forward "l" () flops = -1.0
