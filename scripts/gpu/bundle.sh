#!/bin/bash
# Builds Loom's CUDA targets for a GPU machine that lacks Loom's build
# dependencies, and packs them with the shared libraries they load into one
# archive: .gpu/bundle.txz (scripts/gpu/check.sh runs it there).
#
#   scripts/gpu/bundle.sh            # then: scripts/gpu/check.sh on the GPU machine
#
# Optimised (-c opt, no -march=native: the GPU machine's CPU is another),
# every binary linked with Loom's own code static, in an output tree of its
# own (--platform_suffix). The runfiles of every target are merged into one
# tree (TEST_SRCDIR); the libraries come from ldd, less glibc's, the CUDA
# driver's, cuBLAS's and NCCL's, which the GPU machine has.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=(
  //kernels/cuda:ops_cuda_test
  //runtime/backends/cuda:cuda_backend_test
  //runtime/backends/cuda:cuda_model_test
  //runtime/backends/cuda:cuda_ops_test
  //runtime/backends/cuda:device_test
  //runtime/backends/cuda:nccl_communicator_test
  //runtime/train:device_optimizer_test
  //runtime/train:train_local_device_test
  //tests/integration:gpu_training_test
  //tests/integration:loom_up_gpus_test
  //runtime/scheduling:loom-schedule
  //runtime/train/bench:mfu_bench
  //services/worker/bench:memory_bench
  //kernels/attention/bench:attention_bench
)
FLAGS=(-c opt --config=cuda --platform_suffix=cuda-opt --dynamic_mode=off --force_pic
       --disk_cache="${LOOM_CACHE:-$HOME/.cache/loom}/bazel-disk")
bazel build "${FLAGS[@]}" "${TARGETS[@]}"
BIN=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/runfiles" "$STAGE/lib"
for t in "${TARGETS[@]}"; do
  p=${t#//}; p=${p/://}
  # "loom/path /abs/path" per runfile; a line without a target is an empty file.
  while read -r rel abs; do
    [ -e "$STAGE/runfiles/$rel" ] && continue
    mkdir -p "$STAGE/runfiles/$(dirname "$rel")"
    if [ -n "${abs:-}" ]; then cp -L "$abs" "$STAGE/runfiles/$rel"; else : >"$STAGE/runfiles/$rel"; fi
  done <"$BIN/$p.runfiles_manifest"
done
find "$STAGE/runfiles" -type f -perm -u+x | while read -r f; do
  file -b "$f" | grep -q '^ELF' || continue
  strip --strip-debug "$f" 2>/dev/null || true
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*|\
    libcublas*|libgcc_s.so*|libstdc++.so*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
# UCX loads its transports from a folder of its own (UCX_MODULE_DIR there).
cp -rL /usr/lib/x86_64-linux-gnu/ucx "$STAGE/lib/ucx"
mkdir -p .gpu
rm -f .gpu/bundle.tgz
tar -C "$STAGE" -cf - runfiles lib | xz -T2 -6 >.gpu/bundle.txz
du -h .gpu/bundle.txz
