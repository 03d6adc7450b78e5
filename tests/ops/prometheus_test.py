"""A real Prometheus server (Debian's prometheus) scrapes a real `loom up`
through deploy/prometheus/prometheus.yml; every PromQL expression of the
Grafana dashboard (deploy/grafana/loom.json) must return data, and every
service's /metrics must follow the Prometheus conventions Loom promises.

usage: prometheus_test.py LOOM_UP BIN_DIR LOOMCTL PROM_CONFIG DASHBOARD TMPDIR
"""
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from ops_testing import LoomUp, check, finish, listening_ports, wait_for

LOOM_UP, BIN_DIR, LOOMCTL, PROM_CONFIG, DASHBOARD, TMP = sys.argv[1:7]

# Labels a Loom metric may carry besides role and rank, each with its reason.
EXTRA_LABELS = {
    "loom_build_info": {"version"},  # an info metric: the version is its point
    "loom_preprocess_samples_skipped_total": {"reason"},  # the issue asks for skips by reason (14 values)
    # A worker's pipeline stage (a function of its rank: no new series), so
    # that compute, wait and the bubble sum by stage (issue 15).
    "loom_worker_compute_seconds_total": {"stage"},
    "loom_worker_wait_seconds_total": {"stage"},
    "loom_worker_bubble_seconds_total": {"stage"},
    "loom_worker_recompute_seconds_total": {"stage"},
    # The recovery's three parts (detection, regroup, reload; issue 17).
    "loom_recovery_seconds": {"part"},
    # Which rate limit refused a call: RegisterWorker or SetKey (issue 19).
    "loom_scheduler_rate_limited_total": {"rpc"},
}
# prometheus-cpp's own exporter metrics (like client_golang's promhttp_*).
LIBRARY_PREFIX = "exposer_"


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def dashboard_exprs():
    d = json.load(open(DASHBOARD))
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def check_conventions(metrics_text, service):
    types = {}
    for line in metrics_text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
    bad = []
    for name, kind in types.items():
        if name.startswith(LIBRARY_PREFIX):
            continue
        if not name.startswith("loom_"):
            bad.append(name + ": no loom_ prefix")
        if kind == "counter" and not name.endswith("_total"):
            bad.append(name + ": a counter without _total")
        if kind != "counter" and name.endswith("_total"):
            bad.append(name + ": _total on a " + kind)
        if re.search(r"_(ms|milliseconds|us|microseconds|kb|mb|kib|mib|minutes|hours|percent)(_|$)", name):
            bad.append(name + ": not in base units")
        if kind == "histogram" and not re.search(r"_(seconds|bytes)$", name):
            bad.append(name + ": a histogram that is not in seconds or bytes")
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", line)
        if not m:
            bad.append("unparsable sample: " + line)
            continue
        name = m.group(1)
        if name.startswith(LIBRARY_PREFIX):
            continue
        family = re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in types else name
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
        allowed = {"role", "rank", "le"} | EXTRA_LABELS.get(family, set())
        if not labels <= allowed:
            bad.append("%s: labels %s beyond role and rank" % (name, sorted(labels - allowed)))
        if family.startswith("loom_worker_") and not {"role", "rank"} <= labels:
            bad.append(name + ": a worker metric without role and rank")
    check(not bad, "%s /metrics follows the conventions%s" % (service, "" if not bad else ": " + "; ".join(sorted(set(bad)))))


def main():
    job_path = os.path.join(TMP, "job.json")
    json.dump({"name": "prom", "data": {"samples": 48, "global_batch": 8},
               "parallel": {"encoder_dp": 1, "llm_dp": 1, "microbatches": 2},
               "checkpoint": {"dir": os.path.join(TMP, "ckpt"), "every": 3}}, open(job_path, "w"))

    with LoomUp(LOOM_UP, BIN_DIR, TMP, ["--config=" + job_path, "--steps=0"]) as up:
        run = up.run_dir
        targets_file = os.path.join(run, "prometheus_targets.json")
        if not wait_for(lambda: os.path.exists(targets_file), 300):
            check(False, "loom up wrote " + targets_file)
            return
        # The shipped config, pointed at this run's targets and scraping every second.
        config = open(PROM_CONFIG).read()
        check("../../.loom/run/prometheus_targets.json" in config, "the shipped config reads loom up's targets file")
        config = config.replace("../../.loom/run/prometheus_targets.json", targets_file)
        config = re.sub(r"scrape_interval: \d+s", "scrape_interval: 1s", config)
        config = config.replace("refresh_interval: 2s", "refresh_interval: 1s")
        config_path = os.path.join(TMP, "prometheus.yml")
        open(config_path, "w").write(config)
        for path in (PROM_CONFIG, config_path):
            r = subprocess.run(["promtool", "check", "config", path], capture_output=True, text=True)
            check(r.returncode == 0, "promtool check config " + os.path.basename(os.path.dirname(path)) + "/" +
                  os.path.basename(path) + ("" if r.returncode == 0 else ": " + r.stdout + r.stderr))
        prom_log = open(os.path.join(TMP, "prometheus.log"), "w")
        prom = subprocess.Popen(["prometheus", "--config.file=" + config_path,
                                 "--storage.tsdb.path=" + os.path.join(TMP, "tsdb"),
                                 "--web.listen-address=127.0.0.1:0"], stdout=prom_log,
                                stderr=subprocess.STDOUT)
        try:
            ports = wait_for(lambda: listening_ports(prom.pid), 60)  # the port the kernel chose
            check(bool(ports), "prometheus listens (on port %s)" % ports)
            port = ports[0] if ports else 0
            api = "http://127.0.0.1:%d/api/v1/" % port
            check(wait_for(lambda: "Ready" in get("http://127.0.0.1:%d/-/ready" % port), 60) is not None,
                  "prometheus is ready")

            def query(expr):
                r = json.loads(get(api + "query?" + urllib.parse.urlencode({"query": expr})))
                if r.get("status") != "success":
                    return None
                return [float(s["value"][1]) for s in r["data"]["result"]]

            def active_targets():
                t = json.loads(get(api + "targets"))["data"]["activeTargets"]
                return [x for x in t if x["health"] == "up"]
            services = len(json.load(open(targets_file)))
            up_targets = wait_for(lambda: len(active_targets()) == services and active_targets(), 60)
            check(bool(up_targets), "prometheus scrapes all %d services of loom up" % services)

            exprs = [(t, e.replace("$__rate_interval", "30s")) for t, e in dashboard_exprs()]
            check(len(exprs) >= 15, "the dashboard has %d expressions" % len(exprs))

            def missing():
                out = []
                for title, e in exprs:
                    v = query(e)
                    if not v or not any(math.isfinite(x) for x in v):
                        out.append((title, e, v))
                return out
            left = missing()
            until = time.time() + 240
            while left and time.time() < until:
                time.sleep(2)
                left = missing()
            for title, e in exprs:
                check(all(e != m[1] for m in left), "dashboard panel '%s': %s returns data" % (title, e))
            samples = query("loom_train_samples_total")
            check(bool(samples) and samples[0] > 0, "loom_train_samples_total = %s" % samples)
            mfu = query("loom_train_mfu_ratio")
            check(bool(mfu) and 0 < mfu[0] < 1, "MFU is a ratio in (0, 1): %s" % mfu)

            for t in json.load(open(targets_file)):
                check_conventions(get("http://%s/metrics" % t["targets"][0]), t["labels"]["service"])

            address = open(os.path.join(run, "scheduler_address")).read().strip()
            r = subprocess.run([LOOMCTL, "--scheduler=" + address, "--run_dir=" + up.run_dir, "cancel", "prom"], capture_output=True, text=True)
            check(r.returncode == 0, "loomctl cancel prom")
            rc = up.wait(120)
            check(rc == 0, "loom up exits 0 after the cancel (rc %s)" % rc)
        finally:
            prom.terminate()
            prom.wait(60)


main()
finish()
