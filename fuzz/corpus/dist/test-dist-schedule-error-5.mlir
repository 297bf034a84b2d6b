func.func @blocks() attributes {dist.train_step} {
  "test.br"()[^next] : () -> ()
^next:
  return
}
