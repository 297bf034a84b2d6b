dist.compute forward "" ()
