dist.mesh @m ["ddp" = 2, "fsdp" = 2]
dist.comm @c on @m axes {"ddp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
