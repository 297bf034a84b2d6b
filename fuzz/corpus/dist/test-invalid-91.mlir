func.func @f() {
  "dist.free"() : () -> ()
  return
}
