dist.mesh @m ["x" = 8]
dist.comm @c on @m axes {"x":(1)3}
