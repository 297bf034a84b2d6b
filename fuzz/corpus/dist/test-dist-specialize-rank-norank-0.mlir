dist.mesh @m ["dp" = 2]
