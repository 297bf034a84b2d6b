dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @c on @m axes {"fsdp"}
