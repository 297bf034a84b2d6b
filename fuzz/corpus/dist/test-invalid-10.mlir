dist.mesh @m ["ddp" = 2, "fsdp" = 2]
dist.comm @c on @m axes {"fsdp"} view = #dist.view<"slice(ddp).slice(fsdp)">
