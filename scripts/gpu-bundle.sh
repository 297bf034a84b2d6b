#!/usr/bin/env bash
# Packs what the GPU tests need into one folder that travels to a GPU machine
# (the `device` tool's `carry`; docs/cuda.md, "Running the GPU tests"): the
# GPU test programs and benchmark built here (the CUDA parts compile on
# machines without a GPU), the shared libraries they load that a CUDA image
# lacks (Gloo, hiredis, ibverbs, Google Benchmark, cudart), the planned
# example specs, and run.sh, which runs everything there with no build and
# no MLIR, and writes the results to $OUT/gpu-results.txt.
#
#   scripts/gpu-bundle.sh BUILD_DIR BUNDLE_DIR
#
# BUILD_DIR is a configured build with the CUDA backend (MESHPLAN_CUDA=AUTO
# on a machine with the toolkit). Then, on the GPU machine, from the
# repository root: bash BUNDLE_DIR/run.sh. NCCL is not bundled (220 MB): run.sh
# finds the image's libnccl.so.2 (the CUDA toolkit's, or PyTorch's
# nvidia-nccl wheel). Nor is cuBLAS (600 MB with cuBLASLt), for the model's
# GPU test: run.sh finds it the same way (nvidia-cublas wheel).
set -euo pipefail
build=$(cd "$1" && pwd)
bundle=$2
src=$(cd "$(dirname "$0")/.." && pwd)
targets=$(cmake --build "$build" --target help)
[[ $targets == *MeshplanRuntimeNccl* ]] || {
  echo "gpu-bundle: $build has no CUDA backend (configure with the CUDA toolkit installed)" >&2
  exit 2
}
programs=(RuntimeCudaHostTest RuntimeCudaKernelsTest RuntimeCudaNcclTest TrainerLlamaCudaTest
          runtime-step-check
          bench-cuda-kernels bench-runtime-collectives meshplan)
cmake --build "$build" -j2 --target "${programs[@]}"
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/plans"
for p in RuntimeCudaHostTest RuntimeCudaKernelsTest RuntimeCudaNcclTest TrainerLlamaCudaTest; do
  cp "$build/unittests/$p" "$bundle/bin/"
done
cp "$build/bin/runtime-step-check" "$build/bin/bench-cuda-kernels" \
  "$build/bin/bench-runtime-collectives" "$bundle/bin/"
# Libraries outside the C/C++ runtime and the driver; NCCL and cuBLAS stay
# behind.
for f in "$bundle"/bin/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
  libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | \
    ld-linux* | libnccl.so* | libcuda.so* | libcublas*) ;;
  *) cp -L "$lib" "$bundle/lib/" ;;
  esac
done
# Every step case of runtime.step.* (unittests/CMakeLists.txt), planned here.
cases=(
  "fsdp-fp8-3d|examples/specs/fsdp-fp8-3d.json|8|--replicate ddp --shard fsdp"
  "fsdp-sr-adamw|examples/specs/fsdp-sr-adamw.json|8|--shard fsdp"
  "fsdp-tp|examples/specs/fsdp-tp.json|8|--shard dp_shard"
  "hsdp-managed|examples/specs/hsdp-managed.json|16|--replicate dp_replicate --shard dp_shard"
  "4d-small|test/runtime/specs/4d-small.json|16|--replicate dp_replicate --shard dp_shard"
  "fsdp3-fp8|test/runtime/specs/fsdp3-fp8.json|3|--shard fsdp"
  "fsdp6-tp2|test/runtime/specs/fsdp6-tp2.json|12|--shard dp_shard"
  "hsdp2x3-sr|test/runtime/specs/hsdp2x3-sr.json|6|--replicate dp_replicate --shard dp_shard")
: >"$bundle/cases.txt"
for c in "${cases[@]}"; do
  IFS='|' read -r name spec n flags <<<"$c"
  "$build/bin/meshplan" plan --spec "$src/$spec" --model tiny --all -o "$bundle/plans/$name" \
    >/dev/null
  echo "$name|$n|$flags" >>"$bundle/cases.txt"
done
cp "$src/scripts/gpu-run.sh" "$bundle/run.sh"
# The libraries compress well (OpenBLAS, for the model test's CPU side, is
# 36 MB of the 64 MiB the device tool carries): run.sh unpacks them.
strip --strip-unneeded "$bundle"/bin/* "$bundle"/lib/* 2>/dev/null || true
tar -C "$bundle" -cJf "$bundle/lib.tar.xz" lib
rm -rf "$bundle/lib"
du -sh "$bundle"
