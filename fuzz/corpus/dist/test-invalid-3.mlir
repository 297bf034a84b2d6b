dist.mesh @m ["dp" = 2, "tp" = 2] managed = ["ddp"]
