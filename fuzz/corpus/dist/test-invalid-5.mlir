dist.comm @c on @nowhere axes {"dp"}
