#!/bin/bash
# loom-schedule as a user runs it: scan lines from loom-preprocess scan, a
# plan (of a named model, and of Hugging Face configs), the plan as a job
# config that `loom up` runs, and an assignment by every algorithm; bad
# input named.
set -euo pipefail
sched=runtime/scheduling/loom-schedule
dir="$TEST_TMPDIR/ov"
runtime/data/loom-datagen --preset onevision --samples 48 --seed 5 --out "$dir" >/dev/null
services/preprocess/loom-preprocess scan --shards "$dir/*.tar" --output "$dir/scan.jsonl" \
  --config tiny 2>/dev/null
kept=$(wc -l < "$dir/scan.jsonl")

fail() { echo "FAIL: $*"; exit 1; }
py=/usr/bin/python3

"$sched" plan --batch "$dir/scan.jsonl" --gpus 64 --global_batch 512 --output "$dir/plan.json" \
  --macro_batches 16 --plan_candidates 4 2> "$dir/plan.err"
$py - "$dir/plan.json" "$dir/plan.err" <<'PY' || { cat "$dir/plan.err"; fail "plan"; }
import json, re, sys
p = json.load(open(sys.argv[1]))
e, l = p["encoder"], p["llm"]
# Colocated, the encoder's ranks run on the LLM's first-stage GPUs.
assert (0 if p.get("colocated") else e["gpus"]) + l["gpus"] <= 64, p
if p.get("colocated"):
    assert e["gpus"] == l["tp"] * l["dp"] and e["tp"] % l["tp"] == 0, p
for m in (e, l):
    assert m["gpus"] == m["tp"] * m["pp"] * m["dp"], m
assert p["microbatches"] >= l["pp"] and l["dp"] * p["microbatches"] <= 512, p
assert 0 < p["predicted_mfu"] < 1 and p["predicted_iteration_seconds"] > 0, p
# Macro-batches: four candidates, each simulated over 16 drawn batches; the
# plan is the one of least mean, its distribution in the plan.
d = p["simulated"]
assert d["batches"] == 16 and d["algorithm"] == "loom", d
assert 0 < d["p50"] <= d["p90"] <= d["max"], d
lines = [x for x in open(sys.argv[2]) if x.startswith("loom-schedule: candidate")]
assert len(lines) == 4, lines
means = [float(re.search(r"mean ([0-9.e+-]+)", x).group(1)) for x in lines]
chosen = [x for x in lines if x.rstrip().endswith("<- the plan")]
assert len(chosen) == 1, lines
assert abs(float(re.search(r"mean ([0-9.e+-]+)", chosen[0]).group(1)) - min(means)) <= 1e-5 * min(means), lines
assert re.search(r"microbatches: %d( colocate: true)?( sequence_parallel: true)?:" % p["microbatches"], chosen[0]), (chosen, p)
assert ("colocate: true" in chosen[0]) == bool(p.get("colocated")), (chosen, p)
# Sequence parallelism priced (the default) wherever a module has TP > 1.
tp = max(p["encoder"]["tp"], p["llm"]["tp"])
assert ("sequence_parallel: true" in chosen[0]) == bool(p.get("sequence_parallel")) == (tp > 1), (chosen, p)
PY
# The simulator alone on that plan, over the same seeded batches: the same
# distribution the plan records.
"$sched" simulate --batch "$dir/scan.jsonl" --plan "$dir/plan.json" --macro_batches 16 \
  --output "$dir/sim.json" 2> "$dir/sim.err" || { cat "$dir/sim.err"; fail "simulate"; }
$py - "$dir/plan.json" "$dir/sim.json" <<'PY' || fail "simulate: not the plan's distribution"
import json, sys
want, got = json.load(open(sys.argv[1]))["simulated"], json.load(open(sys.argv[2]))
assert got == want, (got, want)
PY
grep -q "simulated over 16 batches of 512 (loom): mean" "$dir/sim.err" || { cat "$dir/sim.err"; fail "simulate's summary"; }

# A profile of the tiny model's real layers on this CPU; simulate and
# assign price the samples with its coefficients instead of the plan's.
"$sched" profile --config tiny --profile_tiles 1,2 --profile_tokens 64,128 --profile_repeats 1 \
  --output "$dir/profile.json" 2> "$dir/profile.err" || { cat "$dir/profile.err"; fail "profile"; }
grep -q "loom-schedule: profile of tiny on cpu in fp32 at TP 1: " "$dir/profile.err" || fail "profile's summary"
grep -q "loom-schedule: this host's communication: all-reduce " "$dir/profile.err" || fail "profile's communication"
"$sched" assign --batch "$dir/scan.jsonl" --config tiny --llm_dp 2 --microbatches 2 --encoder_dp 1 \
  --profile "$dir/profile.json" --output "$dir/profiled.json" 2>/dev/null || fail "assign --profile"
# A frozen LLM (--freeze llm) is priced by the profile's fit of its frozen
# passes.
"$sched" assign --batch "$dir/scan.jsonl" --config tiny --llm_dp 2 --microbatches 2 --encoder_dp 1 \
  --profile "$dir/profile.json" --freeze llm --output "$dir/profiled-frozen.json" 2>/dev/null ||
  fail "assign --profile --freeze llm"
$py - "$dir/profile.json" "$dir/profiled.json" "$dir/profiled-frozen.json" "$dir/scan.jsonl" <<'PY' || fail "assign --profile (--freeze llm): the profile's prices"
import json, sys
p, a, frozen = (json.load(open(f)) for f in sys.argv[1:4])
assert p["tp"] == 1 and len(p["points"]) == 2 + 2 * 2, p
for pt in p["points"]:
    assert pt["seconds"] > 0 and int(pt["peak_bytes"]) > 0 and pt["frozen_seconds"] > 0, pt
# This host's communication: all-reduces over 2 and 4 ranks, UCX transfers.
kinds = sorted((c["kind"], c["ranks"]) for c in p["comm"])
assert kinds == [("allreduce", 2)] * 2 + [("allreduce", 4)] * 2 + [("transfer", 2)] * 4, kinds
assert int(p["llm_gradient_bytes"]) > 0 and int(p["embedding_bytes_per_image_token"]) > 0, p
assert 0 < p["llm_frozen_share"] <= 1, p
shapes = {json.loads(l)["key"]: json.loads(l) for l in open(sys.argv[4])}
# Every bin's LLM cost is the profile's price of its samples: the trained
# fit's, or the frozen passes' under --freeze llm.
def check(assignment, fit):
    for b in assignment["bins"]:
        want = 0.0
        for k in b["samples"]:
            s = shapes[k]
            L = s.get("image_tokens", 0) + s.get("text_tokens", 0)
            # (a term the fit left at 0 is absent from the JSON)
            want += (p.get(fit + "per_sample", 0) + p.get(fit + "per_token", 0) * L +
                     p.get(fit + "per_token_sq", 0) * L * L)
        assert abs(b["llm_cost"] - want) <= 1e-9 + 1e-6 * want, (fit, b, want)
check(a, "llm_")
check(frozen, "llm_frozen_")
PY
# The plan search's candidates priced by the profile, the macro-batches
# choosing among them.
"$sched" plan --batch "$dir/scan.jsonl" --config tiny --gpus 4 --global_batch 16 \
  --profile "$dir/profile.json" --macro_batches 4 --plan_candidates 3 \
  --output "$dir/profiled-plan.json" 2> "$dir/profiled-plan.err" ||
  { cat "$dir/profiled-plan.err"; fail "plan --profile"; }
$py - "$dir/profile.json" "$dir/profiled-plan.json" <<'PY' || fail "plan --profile: the profile's prices"
import json, sys
p, plan = (json.load(open(f)) for f in sys.argv[1:3])
c = plan["costs"]
for module, key in (("encoder", "encoder_per_tile"), ("llm", "llm_per_token")):
    want = p.get(key, 0)  # (0, absent, when a repeat's noise hands the term to another)
    if plan[module]["tp"] > 1 and want > 0:  # scaled by the planner's TP model: faster, not tp times
        assert want / plan[module]["tp"] < c[key] < want, (module, c, p)
    else:
        assert abs(c.get(key, 0) - want) <= 1e-12 + 1e-9 * want, (module, c, p)
assert plan["simulated"]["batches"] == 4, plan
PY
$py - "$dir/plan.json" "$dir/tp2-plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["encoder"]["tp"], p["llm"]["tp"] = 1, 2
json.dump(p, open(sys.argv[2], "w"))
PY

# Real models from their Hugging Face configs alone (config.json files, no
# weights): Llama-3-8B's and CLIP ViT-L/14-336's, as transformers writes
# them; the plan respects their heads, and its job config and Helm values
# say the same degrees.
cat > "$dir/llama3-8b.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
EOF
cat > "$dir/clip-l-336.json" <<'EOF'
{"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
 "num_attention_heads": 16, "num_hidden_layers": 24, "image_size": 336, "patch_size": 14,
 "hidden_act": "quick_gelu", "layer_norm_eps": 1e-05}
EOF
"$sched" plan --batch "$dir/scan.jsonl" --gpus 256 --global_batch 1024 \
  --llm_from "$dir/llama3-8b.json" --vision_from "$dir/clip-l-336.json" --output "$dir/hf-plan.json" \
  --job_output "$dir/hf-job.json" --values_output "$dir/hf-values.json" --shards "$dir/*.tar"
$py - "$dir/hf-plan.json" "$dir/hf-job.json" "$dir/hf-values.json" helm/loom/values.schema.json <<'PY' || fail "plan from Hugging Face configs"
import json, sys
p, job, values, schema = (json.load(open(f)) for f in sys.argv[1:5])
e, l = p["encoder"], p["llm"]
assert "llama3-8b.json" in p["model"] and e["gpus"] + l["gpus"] <= 256, p
assert not p.get("colocated"), p  # the chart's values: disaggregated layouts alone
assert 32 % l["tp"] == 0 and 8 % l["tp"] == 0 and 16 % e["tp"] == 0, p
assert l["pp"] <= 32 and e["pp"] <= 23, p  # CLIP runs up to LLaVA's feature layer (-2)
assert l["memory_bytes"] > 0, p
par = job["parallel"]
assert (par["llm_tp"], par["llm_pp"], par["llm_dp"]) == (l["tp"], l["pp"], l["dp"]), job
assert (par["encoder_tp"], par["encoder_pp"], par["encoder_dp"]) == (e["tp"], e["pp"], e["dp"]), job
assert par["microbatches"] == p["microbatches"] and job["data"]["global_batch"] == 1024, job
assert par.get("sequence_parallel", False) == (max(l["tp"], e["tp"]) > 1), job
folder = sys.argv[1].rsplit("/", 1)[0]
assert job["hf"] == {"llm_from": folder, "vision_from": folder}, job
assert job["precision"] == "bf16" and job["device"] == {"encoder": "cuda", "llm": "cuda"}, job
assert values == {"job": job}, values
known = schema["properties"]["job"]["properties"]
for k, v in job.items():
    assert k in known, k
    if isinstance(v, dict):
        assert set(v) <= set(known[k]["properties"]), (k, v)
PY

# A cluster of two GPU kinds: each module on one kind, the plan's kinds and
# cost an hour, and the Helm values placing each module on its kind's nodes
# (their nodeSelector, valid under the chart's schema).
cat > "$dir/kinds.json" <<'EOF'
{"kinds": [
  {"name": "H100", "count": 64, "tflops": 989, "memory_gib": 80, "price_per_hour": 3,
   "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
  {"name": "L40S", "count": 128, "tflops": 362, "memory_gib": 48, "price_per_hour": 1,
   "intra_node_gb_per_s": 32, "inter_node_gbps": 200,
   "node_selector": {"nvidia.com/gpu.product": "NVIDIA-L40S"}}]}
EOF
# The fastest plan first; then the cheapest per sample within 1.25x its
# simulated iteration, which costs no more per sample and keeps the bound
# (over the same macro-batches).
for goal in fastest cheapest; do
  args=()
  if [ "$goal" = cheapest ]; then
    bound=$($py -c 'import json, sys; print(1.25 * json.load(open(sys.argv[1]))["simulated"]["mean"])' \
      "$dir/fastest-plan.json")
    args=(--minimise_cost --max_iteration_seconds "$bound")
  fi
  "$sched" plan --batch "$dir/scan.jsonl" --gpu_kinds "$dir/kinds.json" "${args[@]}" --global_batch 512 \
    --recompute selective --output "$dir/kinds-plan.json" --values_output "$dir/kinds-values.json" \
    2> "$dir/kinds.err" || { cat "$dir/kinds.err"; fail "plan --gpu_kinds $goal"; }
  cp "$dir/kinds-plan.json" "$dir/$goal-plan.json"
  grep -q "loom-schedule: plan: encoder on " "$dir/kinds.err" || fail "plan --gpu_kinds: its summary"
  $py - "$dir/kinds-plan.json" "$dir/kinds-values.json" helm/loom/values.schema.json "$goal" <<'PY' || fail "plan --gpu_kinds $goal"
import json, sys
p, values, schema = (json.load(open(f)) for f in sys.argv[1:4])
e, l = p["encoder"], p["llm"]
price = {"H100": 3, "L40S": 1}
count = {"H100": 64, "L40S": 128}
assert e["gpu_kind"] in price and l["gpu_kind"] in price, p
if e["gpu_kind"] == l["gpu_kind"]:
    assert e["gpus"] + l["gpus"] <= count[l["gpu_kind"]], p
else:
    assert e["gpus"] <= count[e["gpu_kind"]] and l["gpus"] <= count[l["gpu_kind"]], p
want = e["gpus"] * price[e["gpu_kind"]] + l["gpus"] * price[l["gpu_kind"]]
assert abs(p["cost_per_hour"] - want) < 1e-6 and p["cluster_gpus"] == e["gpus"] + l["gpus"], p
assert not p.get("colocated"), p  # the chart's values: disaggregated layouts alone
selector = {"H100": "NVIDIA-H100-80GB-HBM3", "L40S": "NVIDIA-L40S"}
for module, m in (("encoder", e), ("llm", l)):
    got = values["workers"][module]["nodeSelector"]
    assert got == {"nvidia.com/gpu.product": selector[m["gpu_kind"]]}, (module, got)
w = schema["properties"]["workers"]["properties"]
module = schema["definitions"]["workerModule"]["properties"]  # every module's ($ref)
assert all(w[m] == {"$ref": "#/definitions/workerModule"} for m in ("encoder", "llm", "generator"))
assert set(values) == {"job", "workers"} and all(set(values["workers"][m]) <= set(module) for m in values["workers"]), values
PY
done
$py - "$dir/fastest-plan.json" "$dir/cheapest-plan.json" <<'PY' || fail "plan --gpu_kinds --minimise_cost: cost and bound"
import json, sys
fast, cheap = (json.load(open(f)) for f in sys.argv[1:3])
per_sample = lambda p: p["cost_per_hour"] * p["simulated"]["mean"]
assert per_sample(cheap) <= per_sample(fast) * (1 + 1e-9), (per_sample(cheap), per_sample(fast))
assert cheap["simulated"]["mean"] <= 1.25 * fast["simulated"]["mean"] * (1 + 1e-9), (cheap["simulated"], fast["simulated"])
PY

# A named model's plan, written as a job config, runs under `loom up` as it is.
"$sched" plan --batch "$dir/scan.jsonl" --gpus 3 --global_batch 16 --config tiny \
  --output "$dir/tiny-plan.json" --job_output "$dir/tiny-job.txtpb" --shards "$dir/*.tar" \
  --device cpu --precision fp32
deploy/launcher/loom-up --bin_dir="$PWD" --run_dir="$dir/run" --config="$dir/tiny-job.txtpb" \
  --steps=1 --json > "$dir/up.log" 2>&1 || { cat "$dir/up.log"; fail "loom up on the planned job"; }
grep -q '"step":1' "$dir/up.log" || fail "loom up trained no step: $(tail -5 "$dir/up.log")"

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

# Validation: the job run by loom up under two layouts, each priced by one
# profile (made first), each with predicted and measured figures, then the
# rankings.
cat > "$dir/job.txtpb" <<EOF
model: "tiny"
data { shards: "$dir/*.tar" global_batch: 8 }
parallel { encoder_dp: 1 llm_dp: 1 microbatches: 2 }
EOF
"$sched" validate --config "$dir/job.txtpb" --layouts 'llm_pp: 1; llm_pp: 2 microbatches: 4' \
  --steps 3 --warmup 1 --dir "$dir/validate" --profile_tiles 1,2 --profile_tokens 32,64 \
  --profile_repeats 1 --output "$dir/validate.jsonl" 2> "$dir/validate.err" ||
  { cat "$dir/validate.err"; fail "validate"; }
$py - "$dir/validate.jsonl" <<'PY' || { cat "$dir/validate.err"; fail "validate's lines"; }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 3, lines
for l, layout, ranks in zip(lines, ["llm_pp: 1", "llm_pp: 2 microbatches: 4"], [2, 3]):
    assert l["layout"] == layout and "error" not in l, l
    assert l["iterations"] == 2 and l["ranks"] == ranks, l
    assert l["predicted_s"] > 0 and l["measured_s"] > 0 and l["step_s"] > 0, l
    assert [(s["module"], s["stage"]) for s in l["stages"]] == \
        [("encoder", 0)] + [("llm", i) for i in range(ranks - 1)], l
    assert all(s["predicted_s"] > 0 and s["measured_s"] > 0 for s in l["stages"]), l
    for m in ("encoder", "llm"):
        assert l["peak_bytes"][m]["measured"] > 0 and l["peak_bytes"][m]["predicted"] > 0, l
r = lines[2]
assert sorted(r["ranking_predicted"]) == sorted(r["ranking_measured"]) == \
    ["llm_pp: 1", "llm_pp: 2 microbatches: 4"], r
assert r["measured"] == 2 and r["largest_error"] >= 0, r
PY
[ -s "$dir/validate/profile.json" ] || fail "validate: the profile it made"

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
expect_error "set --macro_batches > 0" plan --batch "$dir/scan.jsonl" --gpus 4 --config tiny \
  --profile "$dir/profile.json" --macro_batches 0
expect_error "--vision_from: missing" plan --batch "$dir/scan.jsonl" --gpus 8 \
  --llm_from "$dir/llama3-8b.json"
expect_error "--precision: want fp32 or bf16" plan --batch "$dir/scan.jsonl" --gpus 8 \
  --config tiny --job_output "$dir/x.txtpb" --precision fp16
expect_error "--config: " plan --batch "$dir/scan.jsonl" --gpus 8 --config huge
expect_error "llm_tp is 2 (loom-schedule profile --profile_tp)" simulate \
  --batch "$dir/scan.jsonl" --plan "$dir/tp2-plan.json" --profile "$dir/profile.json"
expect_error "--profile_tokens: \"x\" is not a number" profile --config tiny --profile_tokens 64,x
expect_error "leave --gpus out" plan --batch "$dir/scan.jsonl" --gpu_kinds "$dir/kinds.json" --gpus 8
expect_error "need --gpu_kinds" plan --batch "$dir/scan.jsonl" --gpus 8 --minimise_cost
expect_error "--recompute auto is not searched across kinds" plan --batch "$dir/scan.jsonl" \
  --gpu_kinds "$dir/kinds.json" --recompute auto
expect_error "no plan is predicted within 1e-06 s an iteration" plan \
  --batch "$dir/scan.jsonl" --gpu_kinds "$dir/kinds.json" --recompute selective --minimise_cost \
  --macro_batches 4 --max_iteration_seconds 1e-6 --global_batch 512
expect_error "--profile: a profile measures one device" plan --batch "$dir/scan.jsonl" \
  --gpu_kinds "$dir/kinds.json" --recompute selective --profile "$dir/profile.json"
echo '{"kinds": [{"name": "H100", "count": 0}]}' > "$dir/bad-kinds.json"
expect_error "bad-kinds.json: GPU kind \"H100\": no \"tflops\"" plan --batch "$dir/scan.jsonl" \
  --gpu_kinds "$dir/bad-kinds.json"
expect_error "--profile_precision: want fp32 or bf16, got \"fp16\"" profile --config tiny \
  --profile_precision fp16
expect_error 'layout "llm_pp 2": not a parallel { } body' validate --config "$dir/job.txtpb" \
  --layouts 'llm_pp: 1;llm_pp 2' --dir "$dir/validate-bad"
expect_error 'layout "llm_pp: 9": job.' validate --config "$dir/job.txtpb" \
  --layouts 'llm_pp: 9' --dir "$dir/validate-bad"
expect_error "--layouts: none given" validate --config "$dir/job.txtpb" --layouts ' ; '
expect_error "want 0 <= warmup < steps" validate --config "$dir/job.txtpb" --layouts 'llm_pp: 1' \
  --steps 2 --warmup 2
expect_error "--macro_batches (-1) must be >= 0" plan --batch "$dir/scan.jsonl" --gpus 8 \
  --macro_batches -1
echo "loom-schedule: $kept samples, plan and six algorithms checked"
