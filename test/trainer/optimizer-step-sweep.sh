#!/usr/bin/env bash
# Every trainer spec (trainer.equivalence.* and trainer.pipeline.*) with the
# optimizer step of optimizer-step.sh: warmup, cosine decay, clipping at
# every step, no decay on norms and the embedding; each run against
# --reference. ctest runs a few of these (trainer.optimizer-step.*); this is
# the whole sweep (about 5 minutes on 2 cores):
#
#   test/trainer/optimizer-step-sweep.sh build/bin .
set -uo pipefail
bin=$1 src=$2
s=$src/examples/specs rt=$src/test/runtime/specs tr=$src/test/trainer/specs
cases=(
  "$s/fsdp-fp8-3d.json 8 --model tiny"
  "$s/fsdp-sr-adamw.json 8"
  "$s/fsdp-tp.json 8 --model tiny"
  "$s/hsdp-managed.json 16 --model tiny"
  "$rt/4d-small.json 16"
  "$rt/fsdp3-fp8.json 3"
  "$rt/fsdp6-tp2.json 12"
  "$rt/hsdp2x3-sr.json 6"
  "$tr/fsdp3-tp4.json 12"
  "$tr/pp2-1f1b.json 2"
  "$tr/pp4-1f1b.json 4"
  "$tr/pp2-interleaved.json 2"
  "$tr/pp4-interleaved.json 4"
  "$tr/pp2-zbv.json 2"
  "$tr/pp4-zbv.json 4"
  "$tr/pp2-fsdp2-tp2.json 8"
  "$tr/pp2-zbv-fsdp2-tp2.json 8"
  "$tr/pp2-1f1b-bf16.json 2"
  "$tr/pp2-interleaved-bf16.json 2"
  "$tr/pp2-zbv-bf16.json 2"
  "$tr/pp2-fsdp2-tp2-bf16.json 8"
)
failed=0
for c in "${cases[@]}"; do
  read -r spec nproc extra <<<"$c"
  echo "== $(basename "$spec") on $nproc ranks"
  # shellcheck disable=SC2086
  if ! bash "$src/test/trainer/optimizer-step.sh" "$bin" "$spec" "$nproc" 0 $extra; then
    echo "FAIL: $(basename "$spec")"
    failed=$((failed + 1))
  fi
done
echo "optimizer-step sweep: ${#cases[@]} specs, $failed failed"
exit $((failed > 0))
