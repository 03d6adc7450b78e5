#!/bin/bash
# On a GPU machine: unpacks .gpu/bundle.txz (scripts/gpu/bundle.sh) and runs
# issue 41's GPU checks, each bounded in time, logging to /tmp/loom-gpu (and
# all the logs in one $OUT/logs.tgz where $OUT is set): the CUDA tests with
# LOOM_REQUIRE_GPU=1 (nothing may skip but what needs more GPUs than there
# are), loom-train-local --device cuda
# against the CPU for 20 steps, workers sharing the GPU against the single
# process, and mfu_bench with PyTorch's fp32 step of the same shapes beside it
# (scripts/gpu/torch_reference.py).
#
#   scripts/gpu/check.sh [all | a comma-separated list of tests, exit, bench
#                         (= mfu and attention); bf16 (mfu_bench and PyTorch in
#                         bf16, tiny-deep 200 steps bf16 vs fp32 on the GPU);
#                         memory (memory_bench on cuda: the memory model
#                         against each worker's CUDA backend peak); profile
#                         (loom-schedule profile of vit300m-llm1b on the GPU,
#                         fp32 and bf16)]
#
# Environment: DEADLINE=S bounds the whole run (below); ATTENTION_PRECISIONS
# and ATTENTION_SHAPES choose the attention benchmarks; SKIP_CPU=1 skips the
# exit check on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHAT=${1:-all}
want() { [ "$WHAT" = all ] || [[ ",$WHAT," == *",$1,"* ]]; }
LOGS=/tmp/loom-gpu
rm -rf "$LOGS" && mkdir -p "$LOGS"
ROOT=/tmp/loom-bundle
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -C "$ROOT" -xJf .gpu/bundle.txz ||
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .gpu/bundle.txz "$ROOT"
R=$ROOT/runfiles/loom
# NCCL and cuBLAS: the toolkit's, else a Python package's.
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
  echo "$lib: ${f:-not found}"
done | tee "$LOGS/libs.txt"
dirs=$ROOT/lib:/usr/local/cuda/lib64$(sed -n 's|^[^:]*: \(/.*\)/[^/]*$|:\1|p' "$LOGS/libs.txt" | tr -d '\n')
export LD_LIBRARY_PATH="$dirs:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR=$ROOT/lib/ucx
export TEST_SRCDIR=$ROOT/runfiles TEST_WORKSPACE=loom LOOM_REQUIRE_GPU=${LOOM_REQUIRE_GPU:-1}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} 2>&1 | tee "$LOGS/machine.txt"

# The logs so far, packed into $OUT/logs.tgz after every step: a run the
# device tool stops at its limit still brings back what finished.
save() { if [ -n "${OUT:-}" ]; then tar -C "$LOGS" -czf "$OUT/logs.tgz" . 2>/dev/null; fi; }
# DEADLINE=S (seconds from the start) bounds the whole script: each step's
# limit is cut to what is left, and a step with under 15 s left is skipped.
DEADLINE=${DEADLINE:-0}
left() { if [ "$DEADLINE" -gt 0 ]; then echo $((DEADLINE - SECONDS - 10)); else echo 100000; fi; }
run() {  # run NAME SECONDS COMMAND...: its log in $LOGS/NAME.log, one summary line
  local name=$1 secs=$2
  shift 2
  local rest
  rest=$(left)
  if [ "$rest" -lt 15 ]; then
    echo "$name: skipped (deadline)" | tee -a "$LOGS/summary.txt"
    return
  fi
  [ "$rest" -lt "$secs" ] && secs=$rest
  local start=$SECONDS
  TEST_TMPDIR=$(mktemp -d) timeout -k 10 "$secs" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $((SECONDS - start)) s" | tee -a "$LOGS/summary.txt"
  grep -E '^\[  (FAILED|SKIPPED) \].*\([0-9]+ ms\)|largest relative|Failure$|error:' "$LOGS/$name.log" | head -20
  save
}

if want tests; then
  for t in kernels/cuda/ops_cuda_test runtime/backends/cuda/cuda_backend_test \
           runtime/backends/cuda/cuda_model_test runtime/backends/cuda/cuda_ops_test \
           runtime/backends/cuda/device_test runtime/backends/cuda/nccl_communicator_test \
           runtime/train/device_optimizer_test tests/integration/loom_up_gpus_test; do
    run "$(basename $t)" 60 "$R/$t"
  done
  run train_local_device_test 150 "$R/runtime/train/train_local_device_test"
  run gpu_training_test 200 "$R/tests/integration/gpu_training_test"
fi
# `loom up` on DEVICE (cpu or cuda:0), 3 steps, encoder DP 1 + LLM DP 2: the
# services must exit 0 after the job; workers still alive 5 s after its end
# have their threads' stacks written (cuda-gdb) beside the run's logs.
exit_check() {
  local dev=$1 dir=$LOGS/exit-${1/:/}
  mkdir -p "$dir"
  printf "model: 'tiny'\ndata { samples: 32 global_batch: 4 }\ndevice { encoder: '%s' llm: '%s' collectives: 'host' }\n" \
    "$dev" "$dev" >"$dir/job.txtpb"
  "$R/deploy/launcher/loom-up" --bin_dir="$R" --run_dir="$dir/run" --config="$dir/job.txtpb" \
    --encoder_dp=1 --llm_dp=2 --steps=3 >"$dir/up.log" 2>&1 &
  local up=$! waited=0
  until grep -q "job loom \(SUCCEEDED\|FAILED\)" "$dir/up.log" || ! kill -0 $up 2>/dev/null ||
    [ $waited -ge 120 ]; do sleep 1; waited=$((waited + 1)); done
  sleep 5
  for pid in $(pgrep -f "loom-(encoder|llm)-worker" || true); do
    echo "pid $pid alive 5 s after the job's end: $(tr '\0' ' ' </proc/$pid/cmdline | cut -c1-120)"
    timeout 60 cuda-gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt 30" \
      >"$dir/stacks-$pid.txt" 2>&1
  done | tee -a "$dir/alive.txt"
  wait $up
  echo "exit_check $dev: loom up rc $?" | tee -a "$LOGS/summary.txt"
  grep -A8 "^  SERVICE" "$dir/up.log" | tail -7
  cp -r "$dir/run/logs" "$dir/service-logs" 2>/dev/null
}

if want bench || want bf16; then
  # bf16 mixed precision: H100 SXM's dense bf16 peak 989 TFLOP/s (H200's the same).
  run mfu_llm_bf16 150 "$R/runtime/train/bench/mfu_bench" --device cuda --config vit300m-llm1b \
    --modules llm --seq 2048 --gemm 8192 --steps 5 --warmup 2 --peak_tflops 989 --precision bf16
  run mfu_encoder_bf16 150 "$R/runtime/train/bench/mfu_bench" --device cuda --config vit300m-llm1b \
    --modules encoder --tiles 16 --gemm 8192 --steps 5 --warmup 2 --peak_tflops 989 --precision bf16
  run torch_reference_bf16 150 python3 scripts/gpu/torch_reference.py --seq 2048 --tiles 16 \
    --steps 5 --precision bf16
  run train_local_bf16 120 "$R/runtime/train/loom-train-local" --device cuda --config tiny-deep \
    --steps 200 --lr_schedule cosine --min_lr 1e-5 --precision bf16
  run train_local_fp32 120 "$R/runtime/train/loom-train-local" --device cuda --config tiny-deep \
    --steps 200 --lr_schedule cosine --min_lr 1e-5 --precision fp32
fi
if want bench || want mfu; then
  run mfu_llm 150 "$R/runtime/train/bench/mfu_bench" --device cuda --config vit300m-llm1b \
    --modules llm --seq 2048 --gemm 8192 --steps 5 --warmup 2 --peak_tflops 66.9
  run mfu_encoder 150 "$R/runtime/train/bench/mfu_bench" --device cuda --config vit300m-llm1b \
    --modules encoder --tiles 16 --gemm 8192 --steps 5 --warmup 2 --peak_tflops 66.9
  run torch_reference 150 python3 scripts/gpu/torch_reference.py --seq 2048 --tiles 16 --steps 5
fi
# Attention alone, Loom's flash against PyTorch's sdpa, in each of
# $ATTENTION_PRECISIONS (default: fp32 bf16) at each of $ATTENTION_SHAPES
# (LENGTH,HEADS,HEAD_DIM,causal|full,SEQUENCES).
if want bench || want attention; then
  for prec in ${ATTENTION_PRECISIONS:-fp32 bf16}; do
    for shape in ${ATTENTION_SHAPES:-2048,16,128,causal,1 4096,16,128,causal,1 576,16,64,full,16}; do
      IFS=, read -r len heads hd mask batch <<<"$shape"
      run "attention_${prec}_${len}x$batch" 120 "$R/kernels/attention/bench/attention_bench" \
        --device cuda --precision "$prec" --length "$len" --heads "$heads" --head_dim "$hd" \
        --sequences "$batch" --steps 3 --warmup 1 --standard=$([ "$prec" = fp32 ] && echo true || echo false) \
        --causal=$([ "$mask" = causal ] && echo true || echo false)
      run "torch_attention_${prec}_${len}x$batch" 120 python3 scripts/gpu/torch_reference.py \
        --attention "$shape" --precision "$prec" --steps 3 --warmup 1
    done
  done
fi
# The profile of vit300m-llm1b's real layers on the GPU (issue 43 item 1), in
# fp32 and in bf16.
if want profile; then
  for prec in fp32 bf16; do
    run "profile_$prec" 150 "$R/runtime/scheduling/loom-schedule" profile --config vit300m-llm1b \
      --profile_device cuda:0 --profile_precision "$prec" --profile_tiles 1,4,16 \
      --profile_tokens 512,2048,4096 --profile_repeats 3 --profile_communication=false \
      --output "$LOGS/profile-$prec.json"
    grep "profile of" "$LOGS/profile_$prec.log"
  done
fi
if want memory; then
  run memory_bench 400 "$R/services/worker/bench/memory_bench" --device cuda \
    --work_dir /tmp/loom-memory-bench
  grep -E '^  [A-Z].*%|within' "$LOGS/memory_bench.log"
fi
# Last: the exit checks, each skipped with under 150 s left.
if want exit; then
  [ -z "${SKIP_CPU:-}" ] && [ "$(left)" -ge 150 ] && exit_check cpu
  [ "$(left)" -ge 150 ] && exit_check cuda:0
  save
fi
grep -hsE 'TFLOP/s|per patch|flash /|attention_bench on' "$LOGS"/mfu_*.log "$LOGS"/torch_*.log "$LOGS"/attention_*.log
# tiny-deep's bf16 and fp32 runs: the mean loss of their last 20 steps.
for f in "$LOGS"/train_local_*.log; do
  [ -f "$f" ] && python3 -c 'import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if x.startswith("{\"step\"")]
print(sys.argv[1].split("/")[-1], len(l), "steps, mean loss of the last 20:", sum(l[-20:]) / max(1, len(l[-20:])))' "$f" |
    tee -a "$LOGS/summary.txt"
done
cat "$LOGS/summary.txt"
if [ -n "${OUT:-}" ]; then tar -C "$LOGS" -czf "$OUT/logs.tgz" .; fi
