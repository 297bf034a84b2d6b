dist.mesh @m ["dp" = 2, "dp" = 2]
