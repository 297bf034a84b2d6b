"dist.mesh"() <{sym_name = "m", axis_names = ["dp", "tp"], shape = array<i64: 2>}> : () -> ()
