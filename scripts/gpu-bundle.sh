#!/usr/bin/env bash
# Packs what the GPU tests need into one folder that travels to a GPU machine
# (the `device` tool's `carry`; docs/cuda.md, "Running the GPU tests"): the
# GPU test programs and benchmark built here (the CUDA parts compile on
# machines without a GPU), `meshplan` and `meshplan-train` relinked against
# MLIR's and LLVM's static archives (the shared libMLIR and libLLVM are
# 250 MB, four times what the tool carries; linked statically with
# --gc-sections each program keeps the 10 MB it uses), the shared libraries
# they load that a CUDA image lacks (Gloo, hiredis, ibverbs, OpenBLAS,
# cudart), the planned example specs, and run.sh, which runs everything
# there with no build and no MLIR install, and writes the results to
# $OUT/gpu-results.txt.
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
          runtime-step-check bench-cuda-kernels meshplan meshplan-train)
cmake --build "$build" -j2 --target "${programs[@]}"
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/plans"
bundle=$(cd "$bundle" && pwd)
for p in RuntimeCudaHostTest RuntimeCudaKernelsTest RuntimeCudaNcclTest TrainerLlamaCudaTest; do
  cp "$build/unittests/$p" "$bundle/bin/"
done
cp "$build/bin/runtime-step-check" "$build/bin/bench-cuda-kernels" "$bundle/bin/"
# The MLIR programs: the build's own link command with the shared libMLIR and
# libLLVM replaced by every static archive of the same release (lld takes
# from them only what is referenced).
llvm_lib=$(sed -n 's/^MLIR_DIR:[A-Z]*=\(.*\)\/cmake\/mlir$/\1/p' "$build/CMakeCache.txt")
llvm_lib=$(cd "${llvm_lib:-/usr/lib/llvm-22/lib}" && pwd -P)
static="-Wl,--start-group $(ls "$llvm_lib"/libMLIR*.a "$llvm_lib"/libLLVM*.a |
  grep -v ExecutionEngineShared | tr '\n' ' ') -Wl,--end-group"
for p in meshplan meshplan-train; do
  cmd=$(ninja -C "$build" -t commands "$p" | tail -n 1)
  [[ $cmd == *" -o bin/$p "* ]] || { echo "gpu-bundle: no link command for $p" >&2; exit 1; }
  cmd=$(sed -E -e "s# [^ ]*/libMLIR\.so[^ ]*# $static#" -e 's# [^ ]*/libLLVM[-.0-9a-z]*\.so[^ ]*##g' \
    -e "s# -o bin/$p # -o $bundle/bin/$p -Wl,--gc-sections #" <<<"$cmd")
  (cd "$build" && bash -c "$cmd")
  if ldd "$bundle/bin/$p" | grep -q -e libMLIR -e libLLVM; then
    echo "gpu-bundle: $p still loads libMLIR or libLLVM" >&2
    exit 1
  fi
done
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
# Programs and libraries compress well (OpenBLAS, for the CPU side of the
# model test and the trainer's reference, is 36 MB of the 64 MiB the device
# tool carries): run.sh unpacks them.
# The trainer and the model test keep their symbols, for run.sh's
# backtraces.
for f in "$bundle"/bin/* "$bundle"/lib/*; do
  case $(basename "$f") in
  meshplan-train | TrainerLlamaCudaTest) ;;
  *) strip --strip-unneeded "$f" 2>/dev/null || true ;;
  esac
done
tar -C "$bundle" -cJf "$bundle/lib.tar.xz" lib
tar -C "$bundle" -cJf "$bundle/bin.tar.xz" bin
rm -rf "$bundle/lib" "$bundle/bin"
du -sh "$bundle"
