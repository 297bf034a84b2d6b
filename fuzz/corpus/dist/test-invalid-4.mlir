dist.mesh @m ["dp" = 2, "tp" = 2] order = [0, 1, 2]
