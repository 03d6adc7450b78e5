#!/bin/bash
# loom-schedule as a user runs it: scan lines from loom-preprocess scan, a
# plan, and an assignment by every algorithm; bad input named.
set -euo pipefail
sched=runtime/scheduling/loom-schedule
dir="$TEST_TMPDIR/ov"
runtime/data/loom-datagen --preset onevision --samples 48 --seed 5 --out "$dir" >/dev/null
services/preprocess/loom-preprocess scan --shards "$dir/*.tar" --output "$dir/scan.jsonl" \
  --config tiny 2>/dev/null
kept=$(wc -l < "$dir/scan.jsonl")

fail() { echo "FAIL: $*"; exit 1; }
py=/usr/bin/python3

"$sched" plan --batch "$dir/scan.jsonl" --gpus 64 --global_batch 512 --output "$dir/plan.json"
$py - "$dir/plan.json" <<'PY' || fail "plan"
import json, sys
p = json.load(open(sys.argv[1]))
e, l = p["encoder"], p["llm"]
assert e["gpus"] + l["gpus"] <= 64, p
for m in (e, l):
    assert m["gpus"] == m["tp"] * m["pp"] * m["dp"], m
assert p["microbatches"] >= l["pp"] and l["dp"] * p["microbatches"] <= 512, p
assert 0 < p["predicted_mfu"] < 1 and p["predicted_iteration_seconds"] > 0, p
PY

for algorithm in sequential lpt disttrain entrain ilp loom; do
  "$sched" assign --batch "$dir/scan.jsonl" --llm_dp 2 --microbatches 3 --encoder_dp 2 \
    --algorithm "$algorithm" --ilp_seconds 5 --output "$dir/$algorithm.json" 2>/dev/null
  $py - "$dir/$algorithm.json" "$dir/scan.jsonl" "$algorithm" <<'PY' || fail "$algorithm"
import json, sys
a = json.load(open(sys.argv[1]))
keys = [json.loads(l)["key"] for l in open(sys.argv[2]) if l.strip()]
got = [k for b in a["bins"] for k in b["samples"]]
assert sorted(got) == sorted(keys), "every sample exactly once"
assert [(b["llm_rank"], b["microbatch"]) for b in a["bins"]] == [(r, j) for r in range(2) for j in range(3)]
assert all(b["samples"] and 0 <= b["encoder_rank"] < 2 for b in a["bins"])
s = a["summary"]
assert s["algorithm"] == sys.argv[3] and s["samples"] == len(keys) and s["bins"] == 6
for m in ("encoder", "llm"):
    assert s[m]["max_over_lower_bound"] >= 1 - 1e-9 and s[m]["cv"] >= 0
assert s["simulated_iteration_seconds"] > 0 and s["wall_seconds"] >= 0
PY
done

# Costs on the lines override the cost model: two heavy samples must be split.
printf '%s\n' '{"key":"a","encoder_cost":5,"llm_cost":5}' '{"key":"b","encoder_cost":5,"llm_cost":5}' \
  '{"key":"c","encoder_cost":1,"llm_cost":1}' '{"key":"d","encoder_cost":1,"llm_cost":1}' > "$dir/costs.jsonl"
"$sched" assign --batch "$dir/costs.jsonl" --llm_dp 2 --microbatches 1 --encoder_dp 1 \
  --algorithm loom --output "$dir/costs.json" 2>/dev/null
$py - "$dir/costs.json" <<'PY' || fail "costs override"
import json, sys
a = json.load(open(sys.argv[1]))
assert sorted(b["llm_cost"] for b in a["bins"]) == [6, 6], a
PY

# Bad input: a clear error naming what is wrong, exit 2.
expect_error() {
  local want="$1"; shift
  set +e
  msg=$("$sched" "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "exit $rc for $* (want 2)"
  [[ "$msg" == *"$want"* ]] || fail "message for $*: '$msg' lacks '$want'"
}
printf '{"key":"a","imagez":[1]}\n' > "$dir/unknown.jsonl"
expect_error "unknown.jsonl:1" assign --batch "$dir/unknown.jsonl" --llm_dp 1 --microbatches 1 --encoder_dp 1
expect_error "imagez" assign --batch "$dir/unknown.jsonl" --llm_dp 1 --microbatches 1 --encoder_dp 1
printf '{"key":"a","encoder_cost":1,"llm_cost":1}\n{"key":"b"}\n' > "$dir/mixed.jsonl"
expect_error "on every line or on none" assign --batch "$dir/mixed.jsonl" --llm_dp 1 --microbatches 1 --encoder_dp 1
printf '{"key":"a","encoder_cost":1}\n' > "$dir/half.jsonl"
expect_error "give both or neither" assign --batch "$dir/half.jsonl" --llm_dp 1 --microbatches 1 --encoder_dp 1
expect_error "unknown algorithm" assign --batch "$dir/scan.jsonl" --llm_dp 1 --microbatches 1 --encoder_dp 1 --algorithm best
expect_error "fewer than the" assign --batch "$dir/costs.jsonl" --llm_dp 4 --microbatches 2 --encoder_dp 1
expect_error "--plan FILE" assign --batch "$dir/scan.jsonl"
expect_error "at least 2 GPUs" plan --batch "$dir/scan.jsonl" --gpus 1
echo "loom-schedule: $kept samples, plan and six algorithms checked"
