dist.mesh @m ["dp" = 0]
