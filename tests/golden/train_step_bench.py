#!/usr/bin/python3
"""Benchmark (not a test): one training step of the tiny model, Loom against
PyTorch CPU, same model, same global batch (8 samples, 2 microbatches), same
thread count, measured side by side in one run, alternating.

  train_step_bench.py DUMP LOOM_TRAIN_LOCAL [--threads 2] [--rounds 5] [--steps 40]

Loom's time is the median `step_seconds` that loom-train-local prints (its
own timer around Step()); PyTorch's is the median wall time of the same step
(forward, backward, clip, AdamW) written with golden_test.py's model.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_test as g  # noqa: E402
import torch  # noqa: E402


def torch_step_times(d, cfg, steps):
    P = {m: g.params_of(d, f"param/{m}/") for m in ("vit", "projector", "llm")}
    params = [t for mod in P.values() for t in mod.values()]
    opt = g.adamw(cfg, P)  # Loom's weight-decay rule, as the golden test's
    samples = g.step_samples(d, 0)
    n = sum(int((tk[1:] >= 0).sum()) for _, tk in samples)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        for m in range(cfg.micro):
            mb = samples[len(samples) * m // cfg.micro: len(samples) * (m + 1) // cfg.micro]
            _, ls, _ = g.microbatch_loss_sum(cfg, P, mb)
            (ls / n).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[2:]  # drop warm-up steps


def loom_step_times(binary, threads, steps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "--config=tiny", f"--steps={steps}", "--batch_size=8",
                          "--microbatches=2"], env=env, check=True, capture_output=True,
                         text=True).stdout
    return [json.loads(line)["step_seconds"] for line in out.splitlines()][2:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("loom_train_local")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = g.read_dump(a.dump)
    cfg = g.Cfg(d["config"], d["hparams"])
    loom_t, torch_t = [], []
    for _ in range(a.rounds):
        loom_t += loom_step_times(a.loom_train_local, a.threads, a.steps)
        torch_t += torch_step_times(d, cfg, a.steps)
    lm, tm = statistics.median(loom_t), statistics.median(torch_t)
    print(f"train step, tiny model, batch 8 in 2 microbatches, {a.threads} threads, "
          f"{a.rounds} alternating rounds of {a.steps} steps")
    print(f"  loom     median {lm * 1e3:8.2f} ms")
    print(f"  pytorch  median {tm * 1e3:8.2f} ms   (torch {torch.__version__})")
    print(f"  ratio pytorch/loom = {tm / lm:.2f}  (> 1: Loom is faster)")


if __name__ == "__main__":
    main()
