"""The Helm chart helm/loom rendered offline (tools/helm-render: Go's
text/template + sprig, values checked against values.schema.json), with the
default values and with every option on. Every rendered object has
apiVersion, kind and metadata; the objects are those the chart promises;
every container's args pass that service's own flag parser (--check_flags);
the job ConfigMap is a valid job (loomctl validate); bad values are refused
naming the value; checkpoints (job.checkpoint.every, resumeStep,
submitOnStart false) without a shared claim are refused, and with one every
pod mounts it where the job writes. Every object is validated against Kubernetes 1.33's
schemas made strict, the ServiceMonitor against the Prometheus Operator's
(third_party/kubernetes-schemas: an unknown or misspelled field fails, as
the API server's strict field validation refuses it).

usage: helm_test.py HELM_RENDER CHART_DIR BIN_DIR DASHBOARD TMPDIR
"""
import json
import os
import subprocess
import sys

import jsonschema
import yaml

from ops_testing import check, finish

RENDER, CHART, BIN, DASHBOARD, TMP = sys.argv[1:6]
SCHEMAS = os.path.join(BIN, "third_party/kubernetes-schemas")
K8S_SCHEMAS = json.load(open(os.path.join(SCHEMAS, "kubernetes-1.33-strict.json")))
CRD_SCHEMAS = [json.load(open(os.path.join(SCHEMAS, f)))
               for f in ("servicemonitor-strict.json", "certificate-strict.json", "podgroup-strict.json")]
BINARIES = {
    "loom-scheduler": "services/scheduler/loom-scheduler",
    "loom-preprocess": "services/preprocess/loom-preprocess",
    "loom-encoder-worker": "services/encoder_worker/loom-encoder-worker",
    "loom-llm-worker": "services/llm_worker/loom-llm-worker",
    "loom-generator-worker": "services/generator_worker/loom-generator-worker",
}


def render(*args):
    r = subprocess.run([RENDER, "--name", "train", "--namespace", "ml", *args, CHART],
                       capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def objects(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def containers(obj):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", [])


def check_render(name, args, expect):
    rc, out, err = render(*args)
    check(rc == 0, "%s: renders%s" % (name, "" if rc == 0 else ": " + err))
    if rc != 0:
        return []
    objs = objects(out)
    for o in objs:
        ok = isinstance(o.get("apiVersion"), str) and isinstance(o.get("kind"), str) and \
            isinstance(o.get("metadata"), dict) and o["metadata"].get("name")
        check(bool(ok), "%s: %s %s has apiVersion, kind and metadata.name" %
              (name, o.get("kind"), (o.get("metadata") or {}).get("name")))
    kinds = sorted("%s/%s" % (o["kind"], o["metadata"]["name"]) for o in objs)
    check(kinds == sorted(expect), "%s: objects %s" % (name, kinds))
    return objs


def schema_errors(obj):
    """What Kubernetes' own schema (strict) finds wrong with `obj`."""
    kind = "%s %s" % (obj.get("apiVersion"), obj.get("kind"))
    found = [s for s in [K8S_SCHEMAS] + CRD_SCHEMAS if kind in s["kinds"]]
    if not found:
        return ["%s: no Kubernetes %s schema" % (kind, K8S_SCHEMAS["kubernetes"])]
    schema = {"$ref": found[0]["kinds"][kind], "definitions": found[0]["definitions"]}
    return ["%s %s: %s at %s" % (obj["kind"], obj.get("metadata", {}).get("name"), e.message,
                                "/".join(str(p) for p in e.absolute_path) or "/")
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]


def check_schemas(name, objs):
    errors = [e for o in objs for e in schema_errors(o)]
    check(objs and not errors, "%s: every object valid under Kubernetes %s's schemas (strict)%s" %
          (name, K8S_SCHEMAS["kubernetes"], "" if not errors else ": " + "; ".join(errors[:5])))


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_references(name, objs):
    """What a cluster would otherwise only show at install: selectors that
    select, names that resolve, ports that exist."""
    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    services = [o for o in objs if o["kind"] == "Service"]
    configmaps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    bad = []
    for o in objs:
        n = o["metadata"]["name"]
        if len(n) > 63 or not all(c.isalnum() and c.islower() or c.isdigit() or c == "-" for c in n):
            bad.append("%s %s: not a DNS label" % (o["kind"], n))
    for w in workloads:
        pod = w["spec"]["template"]["metadata"]["labels"]
        if w["kind"] != "Job" and not labels_match(w["spec"]["selector"]["matchLabels"], pod):
            bad.append("%s %s: selector does not select its pods" % (w["kind"], w["metadata"]["name"]))
        spec = w["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                bad.append("%s: volume of a missing ConfigMap %s" % (w["metadata"]["name"], v["configMap"]["name"]))
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    bad.append("%s: mount of a missing volume %s" % (c["name"], m["name"]))
        if w["kind"] == "StatefulSet" and not any(s["metadata"]["name"] == w["spec"]["serviceName"] for s in services):
            bad.append("StatefulSet %s: no Service %s" % (w["metadata"]["name"], w["spec"]["serviceName"]))
        if w["kind"] == "Job" and is_worker(w) and not any(
                s["metadata"]["name"] == spec.get("subdomain") and s["spec"].get("clusterIP") == "None"
                for s in services):
            bad.append("Job %s: no headless Service %s for its pods' names" % (w["metadata"]["name"], spec.get("subdomain")))
    for s in services:
        selected = [w for w in workloads if labels_match(s["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        if len(selected) != 1:
            bad.append("Service %s selects %d workloads" % (s["metadata"]["name"], len(selected)))
            continue
        ports = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            if p["targetPort"] not in ports:
                bad.append("Service %s: targetPort %s is no container port" % (s["metadata"]["name"], p["targetPort"]))
    for m in (o for o in objs if o["kind"] == "ServiceMonitor"):
        hits = [s for s in services if labels_match(m["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        if len(hits) != len(services) or any("metrics" not in {p["name"] for p in s["spec"]["ports"]} for s in hits):
            bad.append("ServiceMonitor selects %d of %d Services with a metrics port" % (len(hits), len(services)))
    for b in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
        if sum(labels_match(b["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
               for w in workloads) != 1:
            bad.append("PodDisruptionBudget %s does not select one workload" % b["metadata"]["name"])
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    for w in workloads:
        spec = w["spec"]["template"]["spec"]
        if spec.get("serviceAccountName") not in accounts:
            bad.append("%s: ServiceAccount %s is not rendered" % (w["metadata"]["name"], spec.get("serviceAccountName")))
    for p in (o for o in objs if o["kind"] == "NetworkPolicy"):
        selected = [w for w in workloads
                    if labels_match(p["spec"]["podSelector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])]
        if len(selected) != 1:
            bad.append("NetworkPolicy %s selects %d workloads" % (p["metadata"]["name"], len(selected)))
            continue
        ports = {c_p["containerPort"] for c in selected[0]["spec"]["template"]["spec"]["containers"]
                 for c_p in c.get("ports", [])}
        for rule in p["spec"].get("ingress", []):
            for rp in rule.get("ports", []):
                if rp["port"] not in ports:
                    bad.append("NetworkPolicy %s: port %s is no container port" % (p["metadata"]["name"], rp["port"]))
    check(not bad, "%s: selectors, services, ports, volumes and config maps resolve%s" %
          (name, "" if not bad else ": " + "; ".join(bad)))


def check_args(name, objs):
    for o in objs:
        for c in containers(o):
            binary = os.path.basename(c["command"][0])
            path = os.path.join(BIN, BINARIES.get(binary, binary))
            r = subprocess.run([path, "--check_flags", *c["args"]], capture_output=True, text=True)
            check(r.returncode == 0 and "flags ok" in r.stdout,
                  "%s: %s accepts its args %s%s" % (name, binary, c["args"],
                                                   "" if r.returncode == 0 else ": " + r.stderr.strip()))
            # The check can fail: a flag the service does not know is refused.
            r = subprocess.run([path, "--check_flags", *c["args"], "--no_such_flag=1"],
                               capture_output=True, text=True)
            check(r.returncode != 0, "%s: %s refuses an unknown flag" % (name, binary))


def check_tls(name, objs, tokens=False, server_name="loom"):
    """Mutual TLS: every container gets --tls_dir with the job's Secret
    mounted read-only there, probes by loomctl health with the job's CA (the
    kubelet's gRPC probes speak plaintext); the scheduler --control_tokens
    from its own Secret when one is named."""
    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    bad = []
    for w in workloads:
        spec = w["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        secret = vols.get("tls", {}).get("secret", {})
        identity = {"scheduler": "scheduler", "preprocess": "preprocess"}.get(
            w["metadata"]["labels"]["app.kubernetes.io/component"], "worker")
        want = "train-loom-tls-" + identity
        if secret.get("secretName") != want or \
                sorted(i["key"] for i in secret.get("items", [])) != ["ca.crt", "tls.crt", "tls.key"]:
            bad.append("%s: no tls volume from Secret %s (ca.crt, tls.crt, tls.key)" %
                       (w["metadata"]["name"], want))
        for c in spec["containers"]:
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            if mounts.get("tls", {}).get("mountPath") != "/etc/loom/tls" or not mounts["tls"].get("readOnly"):
                bad.append("%s: tls not mounted read-only at /etc/loom/tls" % c["name"])
            if "--tls_dir=/etc/loom/tls" not in c["args"] or "--insecure" in c["args"] or \
                    "--tls_server_name=" + server_name not in c["args"]:
                bad.append("%s: args %s" % (c["name"], c["args"]))
            for probe in ("livenessProbe", "readinessProbe"):
                cmd = c.get(probe, {}).get("exec", {}).get("command", [])
                if cmd[:1] != ["/usr/local/bin/loomctl"] or "--tls_dir=/etc/loom/tls" not in cmd or \
                        cmd[-2:-1] != ["health"]:
                    bad.append("%s: %s is not loomctl health under TLS: %s" % (c["name"], probe, cmd))
            has_tokens = "--control_tokens=/etc/loom/control/tokens" in c["args"]
            if has_tokens != (tokens and c["name"] == "loom-scheduler"):
                bad.append("%s: --control_tokens %s" % (c["name"], "given" if has_tokens else "missing"))
            if has_tokens and mounts.get("control-tokens", {}).get("mountPath") != "/etc/loom/control":
                bad.append("%s: control tokens not mounted" % c["name"])
    check(not bad, "%s: mutual TLS from the job's Secret, probes by loomctl health%s" %
          (name, " (%s)" % "; ".join(bad) if bad else ""))


def check_locked_down(name, objs, rdma=False):
    """Every pod: Loom's ServiceAccount without a token, non-root, seccomp,
    capabilities dropped (IPC_LOCK only for RDMA workers), a read-only root
    file system with /tmp a volume; every workload behind a NetworkPolicy
    that lets Loom's own pods in."""
    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    bad = []
    for w in workloads:
        n = w["metadata"]["name"]
        spec = w["spec"]["template"]["spec"]
        pod = spec.get("securityContext", {})
        if spec.get("automountServiceAccountToken") is not False:
            bad.append("%s mounts an API token" % n)
        if not pod.get("runAsNonRoot") or pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            bad.append("%s: not non-root with RuntimeDefault seccomp" % n)
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            add = sc.get("capabilities", {}).get("add", [])
            if sc.get("allowPrivilegeEscalation") is not False or not sc.get("readOnlyRootFilesystem") or \
                    sc.get("capabilities", {}).get("drop") != ["ALL"]:
                bad.append("%s: may escalate, writes its root file system, or keeps capabilities" % c["name"])
            if add != (["IPC_LOCK"] if rdma and is_worker(w) else []):
                bad.append("%s adds capabilities %s" % (c["name"], add))
            if "/tmp" not in {m["mountPath"] for m in c.get("volumeMounts", [])}:
                bad.append("%s: /tmp is not a volume" % c["name"])
        labels = w["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in policies if labels_match(p["spec"]["podSelector"]["matchLabels"], labels)]
        if len(mine) != 1:
            bad.append("%s: %d NetworkPolicies" % (n, len(mine)))
            continue
        rules = mine[0]["spec"]["ingress"]
        from_loom = [r for r in rules if "ports" not in r and all(
            "podSelector" in f and "namespaceSelector" not in f for f in r["from"])]
        if not from_loom or not all(
                any(labels_match(f["podSelector"]["matchLabels"], o["spec"]["template"]["metadata"]["labels"])
                    for r in from_loom for f in r["from"]) for o in workloads):
            bad.append("%s: Loom's own pods are not all let in" % n)
        if any("ports" not in r and r not in from_loom for r in rules):
            bad.append("%s: a rule opens every port to others than Loom's pods" % n)
    check(not bad, "%s: pods locked down, each behind a NetworkPolicy%s" %
          (name, "" if not bad else ": " + "; ".join(bad)))


def by(objs, kind, name):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    return None


# What runs Loom's processes: Jobs (workload.kind Job, the default), or
# Deployments and StatefulSets (workload.kind StatefulSet).
WORKLOADS = ("Deployment", "StatefulSet", "Job")


def workload(objs, name):
    for o in objs:
        if o["kind"] in WORKLOADS and o["metadata"]["name"] == name:
            return o
    return None


def pods(w):
    """A workload's pods: a StatefulSet's replicas, a Job's completions."""
    return w["spec"].get("completions", 1) if w["kind"] == "Job" else w["spec"]["replicas"]


def is_worker(w):
    return w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"].endswith("-worker")


def check_checkpoint_volume(base):
    """Checkpoints need one ReadWriteMany claim shared by every pod: with an
    emptyDir per pod each worker writes its part into its own pod and the
    scheduler commits step-N in its own, so the first recovery finds nothing
    to load. Rendering refuses checkpoints (written: job.checkpoint.every >
    0; read: resumeStep > 0; a job the chart cannot see: submitOnStart
    false) without storage.checkpoints.existingClaim, and a checkpoint
    folder outside the claim's mount; with a claim, the scheduler, loom-
    preprocess and every worker mount that claim where the job writes."""
    for what, args, reason in [
        ("checkpoint.every > 0", ["--set", "job.checkpoint.every=100"], "job.checkpoint.every = 100"),
        ("resumeStep > 0", ["--set", "resumeStep=200"], "resumeStep = 200"),
        ("submitOnStart false", ["--set", "submitOnStart=false"], "submitOnStart = false"),
    ]:
        rc, out, err = render(*args)
        check(rc != 0 and "storage.checkpoints.existingClaim" in err and "ReadWriteMany" in err and
              reason in err and "job.checkpoint.every=0" in err,
              "refuses checkpoints (%s) without a shared claim, naming storage.checkpoints.existingClaim, "
              "ReadWriteMany, the reason and the way off (%s)" %
              (what, err.strip().splitlines()[-1] if err.strip() else "rendered"))
    rc, out, err = render("--set", "job.checkpoint.every=100", "--set", "storage.checkpoints.existingClaim=ckpt",
                          "--set", "job.checkpoint.dir=/checkpoints")
    check(rc != 0 and "job.checkpoint.dir" in err and "/var/lib/loom" in err,
          "refuses a checkpoint folder outside the claim's mount, naming job.checkpoint.dir (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))

    for name, args, mount, folder in [
        ("shared checkpoints", ["--set", "job.checkpoint.every=100",
                                "--set", "storage.checkpoints.existingClaim=loom-ckpt"],
         "/var/lib/loom", "/var/lib/loom/checkpoints"),
        ("shared checkpoints elsewhere", ["--set", "job.checkpoint.every=10", "--set", "resumeStep=20",
                                          "--set", "storage.checkpoints.existingClaim=loom-ckpt",
                                          "--set", "storage.checkpoints.mountPath=/ckpt",
                                          "--set", "job.checkpoint.dir=/ckpt/run1"],
         "/ckpt", "/ckpt/run1"),
    ]:
        objs = check_render(name, args, base)
        check_args(name, objs)
        check_references(name, objs)
        check_schemas(name, objs)
        if not objs:
            continue
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        check(job["checkpoint"]["dir"] == folder and folder.startswith(mount + "/"),
              "%s: the job's checkpoint folder %s is on the claim's mount %s" % (name, folder, mount))
        workloads = [o for o in objs if o["kind"] in WORKLOADS]
        bad = []
        for w in workloads:
            vols = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
            if vols.get("checkpoints") != {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "loom-ckpt"}}:
                bad.append("%s: checkpoints volume %s" % (w["metadata"]["name"], vols.get("checkpoints")))
            for c in containers(w):
                m = {m["name"]: m for m in c.get("volumeMounts", [])}.get("checkpoints", {})
                if m.get("mountPath") != mount:
                    bad.append("%s: checkpoints mounted at %s" % (c["name"], m.get("mountPath")))
                if c["name"] != "loom-preprocess" and m.get("readOnly"):
                    bad.append("%s: checkpoints read-only" % c["name"])
        check(len(workloads) == 4 and not bad,
              "%s: the scheduler, loom-preprocess and every worker mount claim loom-ckpt at %s%s" %
              (name, mount, "" if not bad else ": " + "; ".join(bad)))
        sched = containers(workload(objs, "train-loom-scheduler"))[0]["args"]
        check("--run_dir=" + mount in sched, "%s: the scheduler's run folder is the claim's mount" % name)
        if "resumeStep=20" in args:
            pre = containers(workload(objs, "train-loom-preprocess"))[0]["args"]
            check("--cursor=/ckpt/run1/step-20/data_cursor.binpb" in pre,
                  "%s: loom-preprocess reads the cursor from the claim" % name)


def check_valid_job(name, job):
    """`loomctl validate` accepts the rendered job.json (as loom-scheduler would)."""
    path = os.path.join(TMP, name.replace(" ", "-") + ".job.json")
    json.dump(job, open(path, "w"))
    r = subprocess.run([os.path.join(BIN, "services/scheduler/loomctl"), "validate", path],
                       capture_output=True, text=True)
    check(r.returncode == 0, "%s: the job ConfigMap is a valid loom.job.v1.JobConfig%s" %
          (name, "" if r.returncode == 0 else ": " + r.stderr.strip()))


def main():
    base = ["ConfigMap/train-loom-job", "ConfigMap/train-loom-dashboards",
            "Job/train-loom-scheduler", "Service/train-loom-scheduler",
            "Job/train-loom-preprocess", "Service/train-loom-preprocess",
            "Job/train-loom-encoder", "Service/train-loom-encoder",
            "Job/train-loom-llm", "Service/train-loom-llm", "ServiceAccount/train-loom"] + \
        ["NetworkPolicy/train-loom-" + c for c in ("scheduler", "preprocess", "encoder-worker", "llm-worker")]
    objs = check_render("defaults", [], base)
    check_args("defaults", objs)
    check_references("defaults", objs)
    check_schemas("defaults", objs)
    check_locked_down("defaults", objs)
    check_tls("defaults", objs)
    if objs:
        sched = by(objs, "NetworkPolicy", "train-loom-scheduler")["spec"]["ingress"]
        check(not any(r.get("ports") == [{"port": 50051, "protocol": "TCP"}] for r in sched),
              "defaults: the control port is open to Loom's pods only (controlFrom empty)")
    if objs:
        for module, dp in (("encoder", 2), ("llm", 2)):
            s = workload(objs, "train-loom-" + module)
            svc = by(objs, "Service", "train-loom-" + module)
            check(s["spec"].get("completionMode") == "Indexed" and s["spec"]["completions"] == dp and
                  s["spec"]["parallelism"] == dp,
                  "%s Job: Indexed, %d pods at once (parallel.%s_dp)" % (module, dp, module))
            check(svc["spec"].get("clusterIP") == "None" and
                  s["spec"]["template"]["spec"]["subdomain"] == svc["metadata"]["name"],
                  "%s: the headless Service names its pods (subdomain)" % module)
            c = containers(s)[0]
            env = {e["name"] for e in c.get("env", [])}
            check("NCCL_DEBUG" in env and "UCX_LOG_LEVEL" in env, "%s: NCCL_ and UCX_ environment from values" % module)
            check(c["resources"]["limits"].get("nvidia.com/gpu") == 1, "%s: one GPU per rank" % module)
            check(c["image"] == "loom-cuda:0.1.0", "%s: the GPU image (gpuImage, deploy/docker/Dockerfile.cuda)"
                  " by default, got %s" % (module, c["image"]))
            ready = c["readinessProbe"]["exec"]["command"]
            live = c["livenessProbe"]["exec"]["command"]
            check("--scheduler=127.0.0.1:50051" in ready and ready[-2:] == ["health", "loom.worker.v1.%s" % (
                "EncoderWorkerService" if module == "encoder" else "LlmWorkerService")] and live[-2:] == ["health", ""],
                  "%s: grpc.health.v1 liveness and readiness probes (loomctl health over TLS)" % module)
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        check(job["checkpoint"]["every"] == 0,
              "defaults: checkpoints off (job.checkpoint.every 0), as no shared claim is named")
        check_valid_job("defaults", job)
        dash = by(objs, "ConfigMap", "train-loom-dashboards")
        check(dash["metadata"]["labels"].get("grafana_dashboard") == "1" and
              json.loads(dash["data"]["loom.json"]) == json.load(open(DASHBOARD)),
              "dashboards ConfigMap: deploy/grafana/loom.json, labelled for the Grafana sidecar")

    values = os.path.join(TMP, "all-on.yaml")
    open(values, "w").write("""
submitOnStart: true
resumeStep: 200
serviceMonitor: {enabled: true, labels: {release: prometheus}}
networkPolicy:
  controlFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ops}}}, {ipBlock: {cidr: 10.1.0.0/16}}]
  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
podDisruptionBudget: {enabled: true}
rdma: {enabled: true}
storage: {checkpoints: {existingClaim: loom-ckpt}}
env:
  nccl: {NCCL_IB_HCA: mlx5, NCCL_SOCKET_IFNAME: eth0}
  ucx: {UCX_TLS: "rc,sm,self", UCX_NET_DEVICES: "mlx5_0:1"}
job:
  name: big
  model: vit300m-llm1b
  parallel: {encoder_dp: 4, llm_dp: 8, microbatches: 4, llm_tp: 2, llm_pp: 2}
  data: {shards: "/data/laion/*.tar", global_batch: 256}
  device: {encoder: cuda, llm: cpu, collectives: nccl}
  checkpoint: {every: 50}
  train: {steps: 5198, lr: 2.0e-5, warmup_ratio: 0.03, lr_schedule: LR_SCHEDULE_COSINE, min_lr: 1.0e-6,
          encoder_lr: 4.0e-6, projector_lr: 2.0e-5, eps: 1.0e-6}
scheduler: {peakFlops: 1.2e16, extraArgs: ["--ilp_seconds=30"]}
tls: {controlTokensSecret: loom-control-tokens, serverName: loom.ml.svc, refresh: 30s}
workers: {llm: {extraArgs: ["--log_level=debug"]}}
""")
    all_on = base + ["ServiceMonitor/train-loom"] + \
        ["PodDisruptionBudget/train-loom-" + c for c in ("scheduler", "preprocess", "encoder-worker", "llm-worker")]
    objs = check_render("all options", ["-f", values], all_on)
    check_args("all options", objs)
    check_references("all options", objs)
    check_schemas("all options", objs)
    check_locked_down("all options", objs, rdma=True)
    check_tls("all options", objs, tokens=True, server_name="loom.ml.svc")
    if objs:
        budgets = {}
        for b in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
            sel = b["spec"]["selector"]["matchLabels"]
            w = [x for x in objs if x["kind"] in WORKLOADS and
                 labels_match(sel, x["spec"]["template"]["metadata"]["labels"])]
            budgets[b["metadata"]["name"]] = (b["spec"].get("minAvailable"), pods(w[0]) if w else None,
                                              "maxUnavailable" in b["spec"])
        check(budgets and all(m == n and not u for m, n, u in budgets.values()),
              "all options: each PodDisruptionBudget keeps every pod of its Job (minAvailable, which "
              "Kubernetes takes for Job-owned pods) %s" % budgets)
    if objs:
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        want = {"steps": 5198, "lr": 2e-5, "warmup_ratio": 0.03, "lr_schedule": "LR_SCHEDULE_COSINE",
                "min_lr": 1e-6, "encoder_lr": 4e-6, "projector_lr": 2e-5, "eps": 1e-6}
        check(all(job["train"].get(k) == v for k, v in want.items()),
              "all options: the recipe (schedule, warm-up ratio, floor, module peaks, eps) reaches job.json: %s"
              % job["train"])
        check_valid_job("all options", job)
        vols = workload(objs, "train-loom-scheduler")["spec"]["template"]["spec"]["volumes"]
        check({"name": "control-tokens", "secret": {"secretName": "loom-control-tokens", "defaultMode": 0o440,
                                                    "items": [{"key": "tokens", "path": "tokens"}]}} in vols,
              "tls.controlTokensSecret: mounted into the scheduler only")
        rules = by(objs, "NetworkPolicy", "train-loom-scheduler")["spec"]["ingress"]
        control = [r for r in rules if r.get("ports") == [{"port": 50051, "protocol": "TCP"}]]
        check(len(control) == 1 and {"cidr": "10.1.0.0/16"} in [f.get("ipBlock") for f in control[0]["from"]],
              "controlFrom: the scheduler's port grpc from the ops namespace and a CIDR")
        workers = by(objs, "NetworkPolicy", "train-loom-llm-worker")["spec"]["ingress"]
        check(not any(r.get("ports") == [{"port": 50051, "protocol": "TCP"}] for r in workers),
              "controlFrom opens the scheduler's port only, not the workers'")
        llm = containers(workload(objs, "train-loom-llm"))[0]
        check(llm["resources"]["limits"].get("rdma/rdma_shared_device_a") == 1 and
              "IPC_LOCK" in llm["securityContext"]["capabilities"]["add"], "rdma: resource and IPC_LOCK")
        check(pods(workload(objs, "train-loom-llm")) == 32,
              "llm replicas: its grid, parallel.llm_tp x llm_pp x llm_dp")
        check(pods(workload(objs, "train-loom-encoder")) == 4,
              "encoder replicas: encoder_tp (default 1) x encoder_dp")
        pre = containers(workload(objs, "train-loom-preprocess"))[0]["args"]
        check("--start_iteration=200" in pre and any(a.startswith("--cursor=") and "step-200" in a for a in pre),
              "resumeStep: preprocess restarts from the checkpoint's cursor")
        sched = containers(workload(objs, "train-loom-scheduler"))[0]["args"]
        check("--resume_step=200" in sched and "--ilp_seconds=30" in sched,
              "resumeStep: the scheduler resumes the same step as preprocess; extraArgs")
        check("--take_back" in sched and any(a.startswith("--run_dir=") for a in sched),
              "the scheduler takes its job back from the checkpoint volume after a restart")

    # A mixture given in epochs: loom-preprocess reads the sources as one
    # --shards spec, and the job keeps them (and epochs, not steps).
    mixture = os.path.join(TMP, "mixture.yaml")
    open(mixture, "w").write("""
job:
  data:
    shards: null
    sources: [{shards: "/data/llava-665k/*.tar", weight: 3}, {shards: "/data/sharegpt4v/*.tar"}]
    validation: {shards: "/data/val/*.tar", every: 100, samples: 40}
  train: {steps: null, epochs: 1.5, lr_schedule: LR_SCHEDULE_COSINE, warmup_ratio: 0.03}
""")
    objs = check_render("mixture", ["-f", mixture], base)
    check_args("mixture", objs)
    if objs:
        pre = containers(workload(objs, "train-loom-preprocess"))[0]["args"]
        check("--validation_shards=/data/val/*.tar" in pre and "--validation_batches=2" in pre,
              "mixture: the held-out set reaches loom-preprocess in whole batches (40 // 16)")
        check("--shards=/data/llava-665k/*.tar=3,/data/sharegpt4v/*.tar=1" in pre,
              "mixture: loom-preprocess's --shards is the sources with their weights: %s" %
              [a for a in pre if a.startswith("--shards")])
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        check(len(job["data"].get("sources", [])) == 2 and "shards" not in job["data"] and
              job["train"].get("epochs") == 1.5 and "steps" not in job["train"],
              "mixture: job.json has the sources and epochs: %s %s" % (job["data"], job["train"]))
        check_valid_job("mixture", job)
    both = os.path.join(TMP, "both.yaml")
    open(both, "w").write("job: {data: {sources: [{shards: /data/a/*.tar}]}}\n")
    zero_weight = os.path.join(TMP, "zero-weight.yaml")
    open(zero_weight, "w").write("job: {data: {shards: null, sources: [{shards: /data/a/*.tar, weight: 0}]}}\n")

    # TLS off: every service --insecure, the kubelet's gRPC probes, no Secret.
    objs = check_render("tls off", ["--set", "tls.enabled=false"], base)
    check_args("tls off", objs)
    check_schemas("tls off", objs)
    if objs:
        cs = [c for o in objs if o["kind"] in WORKLOADS for c in containers(o)]
        check(cs and all("--insecure" in c["args"] and not any(a.startswith("--tls_dir") for a in c["args"]) and
                         "grpc" in c["readinessProbe"] and "tls" not in {m["name"] for m in c["volumeMounts"]}
                         for c in cs),
              "tls.enabled=false: --insecure, gRPC probes, no TLS volume")

    objs = check_render("no network policies", ["--set", "networkPolicy.enabled=false"],
                        [k for k in base if not k.startswith("NetworkPolicy/")])
    check_references("no network policies", objs)
    check_schemas("no network policies", objs)

    # Hugging Face directories on a models volume: every pod mounts it
    # read-only, loom-preprocess gets the directory flags, the job no model.
    objs = check_render("hf", ["--set", "job.hf.llm_from=/models/llama",
                               "--set", "job.hf.vision_from=/models/clip",
                               "--set", "storage.models.existingClaim=models"], base)
    check_args("hf", objs)
    check_references("hf", objs)
    check_schemas("hf", objs)
    if objs:
        pre = containers(workload(objs, "train-loom-preprocess"))[0]["args"]
        check("--llm_from=/models/llama" in pre and "--vision_from=/models/clip" in pre and
              not any(a.startswith("--config=") for a in pre),
              "hf: loom-preprocess reads the directories, not --config")
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        check("model" not in job and job["hf"]["llm_from"] == "/models/llama",
              "hf: the job names the directories and no model")
        for name in ("train-loom-scheduler", "train-loom-preprocess", "train-loom-encoder", "train-loom-llm"):
            o = workload(objs, name)
            mounts = {m["name"]: m for m in containers(o)[0]["volumeMounts"]}
            vols = {v["name"]: v for v in o["spec"]["template"]["spec"]["volumes"]}
            check("models" in mounts and mounts["models"].get("readOnly") and
                  mounts["models"]["mountPath"] == "/models" and
                  vols.get("models", {}).get("persistentVolumeClaim", {}).get("claimName") == "models",
                  "hf: %s mounts the models volume read-only" % name)

    # LLaVA's two stages from values alone: stage 1 (vision and LLM frozen,
    # the projector trains) and stage 2 (vision frozen, the weights from
    # stage 1's checkpoint on the shared claim), each job accepted by
    # `loomctl validate`; init off every mounted volume, and all three
    # modules frozen, are refused by name.
    llava = os.path.join(TMP, "llava.yaml")
    open(llava, "w").write("""
storage: {models: {existingClaim: models}, checkpoints: {existingClaim: ckpt}}
job:
  name: llava-stage
  model: null
  hf: {llava: /models/llava-1.5-7b-hf}
  data:
    shards: null
    sources: [{shards: /data/blip-558k/*.tar, weight: 1}]
    global_batch: 256
    chat_template: vicuna_v1
    image_aspect_ratio: pad
  precision: bf16
  parallel: {encoder_dp: 2, llm_dp: 4, microbatches: 4}
""")
    stage2 = os.path.join(TMP, "llava-stage2.yaml")
    open(stage2, "w").write("""
job:
  freeze: {vision: true}
  init: {checkpoint: /var/lib/loom/llava-stage1/checkpoints/step-2180}
  checkpoint: {dir: /var/lib/loom/llava-stage2/checkpoints, every: 500}
""")
    for stage, args, freeze in (
            ("LLaVA stage 1", ["-f", llava, "--set", "job.freeze.vision=true", "--set", "job.freeze.llm=true"],
             {"vision": True, "llm": True}),
            ("LLaVA stage 2", ["-f", llava, "-f", stage2], {"vision": True})):
        objs = check_render(stage, args, base)
        check_args(stage, objs)
        check_references(stage, objs)
        check_schemas(stage, objs)
        if objs:
            job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
            check(job.get("freeze") == freeze and "model" not in job and
                  job["hf"] == {"llava": "/models/llava-1.5-7b-hf"},
                  "%s: the job freezes %s and reads the LLaVA directory (%s)" %
                  (stage, sorted(freeze), job.get("freeze")))
            if stage.endswith("2"):
                check(job.get("init") == {"checkpoint": "/var/lib/loom/llava-stage1/checkpoints/step-2180"},
                      "LLaVA stage 2: the job starts from stage 1's weights (%s)" % job.get("init"))
            # loomctl validate reads the files a job names: here the named
            # 7B model stands for the LLaVA directory (and its image
            # processor's padding), and stage 1's step folder is one with
            # its three module files.
            offline = json.loads(json.dumps(job))
            offline.pop("hf")
            offline["data"].pop("image_aspect_ratio")
            offline["model"] = "vit300m-llm7b"
            if "init" in offline:
                step = os.path.join(TMP, "stage1", "step-2180")
                os.makedirs(step, exist_ok=True)
                for module in ("encoder", "projector", "llm"):
                    open(os.path.join(step, module + ".ckpt"), "w").close()
                offline["init"]["checkpoint"] = step
            check_valid_job(stage, offline)
    for what, args, named in [
        ("init off every volume", ["-f", llava, "-f", stage2, "--set", "job.init.checkpoint=/tmp/step-1"],
         "job.init.checkpoint /tmp/step-1 is on no volume every worker mounts"),
        ("every module frozen", ["-f", llava, "--set", "job.freeze.vision=true", "--set", "job.freeze.llm=true",
                                 "--set", "job.freeze.projector=true"], "job.freeze: Must not validate"),
        ("init through ..", ["-f", llava, "-f", stage2, "--set",
                             "job.init.checkpoint=/var/lib/loom/../etc/step-1"], "no .. in the path"),
    ]:
        rc, out, err = render(*args)
        check(rc != 0 and named in err, "LLaVA values: refuses %s, naming it (%s)" %
              (what, err.strip().splitlines()[-1] if err.strip() else ""))

    # An extra volume both modules mount at one path holds it too.
    shared = os.path.join(TMP, "shared-volume.yaml")
    open(shared, "w").write("""
storage: {checkpoints: {existingClaim: ""}}
job: {init: {checkpoint: /shared/llava-stage1/step-2180}, checkpoint: {every: 0}}
workers:
  encoder: {extraVolumes: [{name: shared, persistentVolumeClaim: {claimName: team}}],
            extraVolumeMounts: [{name: shared, mountPath: /shared}]}
  llm: {extraVolumes: [{name: shared, persistentVolumeClaim: {claimName: team}}],
        extraVolumeMounts: [{name: shared, mountPath: /shared}]}
""")
    objs = check_render("init on a shared extra volume", ["-f", llava, "-f", stage2, "-f", shared], base)
    check_schemas("init on a shared extra volume", objs)
    other = os.path.join(TMP, "other-mount.yaml")
    open(other, "w").write("workers: {llm: {extraVolumeMounts: [{name: shared, mountPath: /other}]}}\n")
    rc, out, err = render("-f", llava, "-f", stage2, "-f", shared, "-f", other)
    check(rc != 0 and "is on no volume every worker mounts" in err,
          "LLaVA values: refuses init on a volume only one module mounts (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))

    check_checkpoint_volume(base)

    bad_peer = os.path.join(TMP, "bad-peer.yaml")
    open(bad_peer, "w").write("networkPolicy: {metricsFrom: [{cidr: 10.0.0.0/8}]}\n")  # not under ipBlock
    # Without GPUs the workers run the CPU image, as the other services do.
    objs = check_render("no GPUs", ["--set", "gpu.enabled=false"], base)
    if objs:
        images = {o["metadata"]["name"]: containers(o)[0]["image"] for o in objs
                  if o["kind"] in WORKLOADS}
        check(set(images.values()) == {"loom:0.1.0"} and
              "nvidia.com/gpu" not in containers(workload(objs, "train-loom-llm"))[0]["resources"]["limits"],
              "gpu.enabled false: every pod runs image, no GPU requested (%s)" % images)

    # Placement per module over the shared one: the encoder on L40S nodes,
    # the LLM on H100 nodes (a heterogeneous plan), both in one pool.
    placed = os.path.join(TMP, "placed.yaml")
    open(placed, "w").write("""
workers:
  nodeSelector: {pool: training, gpu: any}
  tolerations: [{key: training, operator: Exists, effect: NoSchedule}]
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: x}}}}]}}
  encoder:
    nodeSelector: {gpu: l40s}
    tolerations: [{key: l40s, operator: Exists, effect: NoSchedule}]
  llm:
    nodeSelector: {gpu: h100}
    affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: nvlink, operator: In, values: ["true"]}]}]}}}
""")
    objs = check_render("per-module placement", ["-f", placed], base)
    check_schemas("per-module placement", objs)
    if objs:
        spec = {m: workload(objs, "train-loom-" + m)["spec"]["template"]["spec"] for m in ("encoder", "llm")}
        check(spec["encoder"]["nodeSelector"] == {"pool": "training", "gpu": "l40s"} and
              spec["llm"]["nodeSelector"] == {"pool": "training", "gpu": "h100"},
              "per-module placement: each module's nodeSelector keys over the shared ones (%s)" %
              {m: s.get("nodeSelector") for m, s in spec.items()})
        lost = ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]  # workload.nodeLostSeconds
        check([t["key"] for t in spec["encoder"]["tolerations"]] == ["training", "l40s"] + lost and
              [t["key"] for t in spec["llm"]["tolerations"]] == ["training"] + lost,
              "per-module placement: a module's tolerations add to the shared ones (and the lost node's)")
        check(list(spec["encoder"]["affinity"]) == ["podAntiAffinity"] and
              list(spec["llm"]["affinity"]) == ["nodeAffinity"],
              "per-module placement: a module's affinity replaces the shared one, else the shared one")
        for d in ("scheduler", "preprocess"):
            check("nodeSelector" not in workload(objs, "train-loom-" + d)["spec"]["template"]["spec"],
                  "per-module placement: %s keeps its own (empty) placement" % d)

    # cert-manager makes the TLS Secrets: a Certificate per identity into
    # the Secret its pods mount, and an operator's (client use only), each
    # valid under cert-manager's own schema; without an issuer it fails.
    objs = check_render("cert-manager", ["--set", "tls.certManager.enabled=true",
                                         "--set", "tls.certManager.issuerRef.name=loom-ca",
                                         "--set", "tls.certManager.issuerRef.kind=ClusterIssuer"],
                        base + ["Certificate/train-loom-" + i for i in ("scheduler", "preprocess", "worker", "admin")])
    check_schemas("cert-manager", objs)
    if objs:
        certs = {o["metadata"]["name"].rsplit("-", 1)[1]: o["spec"] for o in objs if o["kind"] == "Certificate"}
        mounted = {}
        for name, ident in (("train-loom-scheduler", "scheduler"), ("train-loom-preprocess", "preprocess"),
                            ("train-loom-encoder", "worker"), ("train-loom-llm", "worker")):
            vols = {v["name"]: v for v in workload(objs, name)["spec"]["template"]["spec"]["volumes"]}
            mounted.setdefault(ident, set()).add(vols["tls"]["secret"]["secretName"])
        check(all(mounted[i] == {certs[i]["secretName"]} for i in mounted),
              "cert-manager: each identity's Certificate writes the Secret its pods mount (%s)" % mounted)
        check(all(certs[i]["commonName"] == "loom-" + i for i in certs) and
              certs["worker"]["dnsNames"] == ["loom"] and "server auth" in certs["worker"]["usages"] and
              "server auth" not in certs["admin"]["usages"] and "client auth" in certs["admin"]["usages"] and
              certs["admin"]["secretName"] == "train-loom-tls-admin" and
              all(c["issuerRef"] == {"name": "loom-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
                  for c in certs.values()),
              "cert-manager: common names loom-<identity>, serverName as the DNS name, the admin's for clients only")
        broken = json.loads(json.dumps(by(objs, "Certificate", "train-loom-worker")))
        broken["spec"]["usages"].append("server-auth")
        broken["spec"]["commonname"] = broken["spec"].pop("commonName")
        errors = schema_errors(broken)
        check(any("commonname" in e for e in errors) and any("usages" in e for e in errors),
              "cert-manager: its schema refuses a misspelled field and an unknown usage (%s)" % errors)
    rc, out, err = render("--set", "tls.certManager.enabled=true")
    check(rc != 0 and "issuerRef" in err, "cert-manager: refuses no issuer, naming it (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))

    # More per module: env, envFrom, extra volumes and mounts, pod labels
    # and annotations; the workers' scheduler and priority class.
    extra = os.path.join(TMP, "extra.yaml")
    open(extra, "w").write("""
workers:
  schedulerName: volcano
  priorityClassName: training-high
  llm:
    env: [{name: HF_HOME, value: /scratch/hf}, {name: WANDB_API_KEY, valueFrom: {secretKeyRef: {name: wandb, key: key}}}]
    envFrom: [{configMapRef: {name: site-env}}]
    extraVolumes: [{name: scratch, emptyDir: {sizeLimit: 100Gi}}]
    extraVolumeMounts: [{name: scratch, mountPath: /scratch}]
    podLabels: {kueue.x-k8s.io/queue-name: gpu-queue}
    podAnnotations: {k8s.v1.cni.cncf.io/networks: rdma-net}
""")
    objs = check_render("per-module extras", ["-f", extra], base)
    check_references("per-module extras", objs)
    check_schemas("per-module extras", objs)
    check_locked_down("per-module extras", objs)
    if objs:
        llm = workload(objs, "train-loom-llm")
        enc = workload(objs, "train-loom-encoder")
        c = containers(llm)[0]
        pod = llm["spec"]["template"]
        env = [e["name"] for e in c["env"]]
        check(env[0] == "POD_IP" and env[-2:] == ["HF_HOME", "WANDB_API_KEY"] and "NCCL_DEBUG" in env and
              c.get("envFrom") == [{"configMapRef": {"name": "site-env"}}],
              "per-module extras: the LLM's env after Loom's own, and its envFrom (%s)" % env)
        check({"name": "scratch", "mountPath": "/scratch"} in c["volumeMounts"] and
              {"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}} in pod["spec"]["volumes"],
              "per-module extras: the LLM's extra volume, mounted")
        check(pod["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == "gpu-queue" and
              pod["metadata"]["labels"].get("app.kubernetes.io/component") == "llm-worker" and
              pod["metadata"].get("annotations") == {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
              "per-module extras: the LLM pods' labels (beside the selector's) and annotations")
        for s in (llm, enc):
            spec = s["spec"]["template"]["spec"]
            check(spec.get("schedulerName") == "volcano" and spec.get("priorityClassName") == "training-high",
                  "per-module extras: %s under the workers' scheduler and priority class" % s["metadata"]["name"])
        check("envFrom" not in containers(enc)[0] and "kueue.x-k8s.io/queue-name" not in
              enc["spec"]["template"]["metadata"]["labels"],
              "per-module extras: the encoder keeps none of the LLM's")
    relabel = os.path.join(TMP, "relabel.yaml")
    open(relabel, "w").write("workers: {llm: {podLabels: {app.kubernetes.io/component: x}}}\n")
    rc, out, err = render("-f", relabel)
    check(rc != 0 and "podLabels" in err and "Invalid type" not in err,
          "per-module extras: a pod label may not replace the selector's (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))

    # NOTES.txt counts each module's ranks as its TP x PP x DP grid.
    rc, out, err = render("--notes", "--set", "job.parallel.llm_tp=2", "--set", "job.parallel.llm_pp=2",
                          "--set", "job.parallel.encoder_tp=2")
    check(rc == 0 and "4 encoder worker ranks (TP 2 x PP 1 x DP 2) and 8 LLM worker ranks "
          "(TP 2 x PP 2 x DP 2)." in out, "NOTES.txt: each module's ranks are its grid (%s)" %
          (out.splitlines()[0] if rc == 0 and out else err.strip()))

    # A model with a generator: a third StatefulSet, generator_tp x
    # generator_pp x generator_dp ranks of loom-generator-worker, with its
    # probes, placement, PDB and NetworkPolicy; the job carries the
    # generator's fields and passes loomctl validate, MetaQuery's freeze
    # (vision, projector and LLM: only the generator trains) included.
    gen = os.path.join(TMP, "generator.yaml")
    open(gen, "w").write("""
podDisruptionBudget: {enabled: true}
job:
  name: metaquery
  model: tiny-gen
  freeze: {vision: true, projector: true, llm: true}
  parallel: {encoder_dp: 1, llm_dp: 2, llm_pp: 2, generator_dp: 2, generator_pp: 2}
  train: {steps: 100, generation_weight: 0.5, generator_lr: 1.0e-4}
workers:
  generator: {nodeSelector: {gpu: l40s}, podLabels: {team: gen}}
""")
    components = ("scheduler", "preprocess", "encoder-worker", "llm-worker", "generator-worker")
    objs = check_render("generator", ["-f", gen],
                        [o for o in base if not o.startswith("NetworkPolicy/")] +
                        ["Job/train-loom-generator", "Service/train-loom-generator"] +
                        ["NetworkPolicy/train-loom-" + c for c in components] +
                        ["PodDisruptionBudget/train-loom-" + c for c in components])
    check_args("generator", objs)
    check_references("generator", objs)
    check_schemas("generator", objs)
    check_locked_down("generator", objs)
    check_tls("generator", objs)
    if objs:
        s = workload(objs, "train-loom-generator")
        c = containers(s)[0]
        pod = s["spec"]["template"]
        check(pods(s) == 4 and c["command"] == ["/usr/local/bin/loom-generator-worker"] and
              c["readinessProbe"]["exec"]["command"][-2:] == ["health", "loom.worker.v1.GeneratorWorkerService"] and
              c["resources"]["limits"].get("nvidia.com/gpu") == 1,
              "generator: 4 ranks (TP 1 x PP 2 x DP 2) of loom-generator-worker, a GPU each, probed on "
              "GeneratorWorkerService")
        check(pod["spec"].get("nodeSelector") == {"gpu": "l40s"} and pod["metadata"]["labels"].get("team") == "gen"
              and "nodeSelector" not in workload(objs, "train-loom-llm")["spec"]["template"]["spec"],
              "generator: its own placement and pod labels, not the LLM's")
        job = json.loads(by(objs, "ConfigMap", "train-loom-job")["data"]["job.json"])
        check(job["model"] == "tiny-gen" and job["parallel"]["generator_dp"] == 2 and
              job["parallel"]["generator_pp"] == 2 and job["train"]["generation_weight"] == 0.5 and
              job["freeze"] == {"vision": True, "projector": True, "llm": True},
              "generator: the job carries the generator's degrees, weight and MetaQuery's freeze (%s)" %
              {k: job.get(k) for k in ("parallel", "freeze")})
        check_valid_job("generator", job)
    rc, out, err = render("--notes", "-f", gen)
    check(rc == 0 and "1 encoder worker ranks (TP 1 x PP 1 x DP 1), 4 LLM worker ranks (TP 1 x PP 2 x DP 2) "
          "and 4 generator worker ranks (TP 1 x PP 2 x DP 2)." in out,
          "NOTES.txt: the generator's ranks too (%s)" % (out.splitlines()[0] if rc == 0 and out else err.strip()))
    for what, args, named in [
        ("generator degrees for a model without one", ["--set", "job.parallel.generator_dp=2"],
         "job.parallel.generator_dp: the model (job.model) has no generator"),
        ("a frozen generator in a model without one", ["--set", "job.freeze.generator=true"],
         "job.freeze.generator"),
        ("every module of a generator model frozen", ["-f", gen, "--set", "job.freeze.generator=true"],
         "job.freeze: Must not validate"),
        ("a colocated plan", ["--set", "job.parallel.colocate=true"], "job.parallel.colocate"),
    ]:
        rc, out, err = render(*args)
        check(rc != 0 and named in err, "generator values: refuses %s, naming it (%s)" %
              (what, err.strip().splitlines()[-1] if err.strip() else "rendered"))
    # init's step folder must be on a volume the generator's pods mount too.
    mounts = os.path.join(TMP, "gen-mounts.yaml")
    open(mounts, "w").write("""
storage: {checkpoints: {existingClaim: ""}}
job: {init: {checkpoint: /shared/run/step-10}, checkpoint: {every: 0}}
workers:
  encoder: {extraVolumes: [{name: shared, persistentVolumeClaim: {claimName: team}}],
            extraVolumeMounts: [{name: shared, mountPath: /shared}]}
  llm: {extraVolumes: [{name: shared, persistentVolumeClaim: {claimName: team}}],
        extraVolumeMounts: [{name: shared, mountPath: /shared}]}
""")
    rc, out, err = render("-f", gen, "-f", mounts)
    check(rc != 0 and "every module of workers (encoder, llm, generator) mounts" in err,
          "generator values: refuses init on a volume the generator does not mount (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))
    gen_mounts = os.path.join(TMP, "gen-mounts-too.yaml")
    open(gen_mounts, "w").write("""
workers:
  generator: {extraVolumes: [{name: shared, persistentVolumeClaim: {claimName: team}}],
              extraVolumeMounts: [{name: shared, mountPath: /shared}]}
""")
    rc, out, err = render("-f", gen, "-f", mounts, "-f", gen_mounts)
    check(rc == 0, "generator values: init on a volume every module mounts renders (%s)" %
          (err.strip().splitlines()[-1] if err.strip() else "rendered"))

    # The job's end ends the workload (workload.kind Job, the default):
    # every process runs with --exit_on_job_end and exits 0 once the job is
    # final, so each Job completes and frees its GPUs; the scheduler's exit
    # 3 (FAILED) fails its Job at once, a node's disruption does not count;
    # crashed workers restart in their pod; a lost node's pods are evicted
    # after workload.nodeLostSeconds and started elsewhere; finished Jobs
    # are deleted ttlSecondsAfterFinished later.
    objs = check_render("jobs", ["--set", "workload.nodeLostSeconds=45", "--set",
                                 "workload.ttlSecondsAfterFinished=600"], base)
    if objs:
        jobs = [o for o in objs if o["kind"] in WORKLOADS]
        check(len(jobs) == 4 and all(j["kind"] == "Job" for j in jobs),
              "jobs: the scheduler, loom-preprocess and each module's workers are Jobs")
        check(all("--exit_on_job_end" in containers(j)[0]["args"] for j in jobs),
              "jobs: every process exits 0 once the job ends (--exit_on_job_end)")
        check(all(j["spec"]["ttlSecondsAfterFinished"] == 600 and j["spec"]["backoffLimit"] == 10 and
                  "suspend" not in j["spec"] for j in jobs),
              "jobs: deleted 600 s after they finish, 10 failures allowed, not suspended without Kueue")
        lost = [{"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 45}
                for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]
        check(all(all(t in j["spec"]["template"]["spec"].get("tolerations", []) for t in lost) for j in jobs),
              "jobs: a lost node's pods are evicted after workload.nodeLostSeconds (45 s) and started elsewhere")
        sched = workload(objs, "train-loom-scheduler")["spec"]
        check(sched["template"]["spec"]["restartPolicy"] == "Never" and sched["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onExitCodes": {"containerName": "loom-scheduler", "operator": "In", "values": [3]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}],
              "jobs: the scheduler's exit 3 (a FAILED job) fails its Job; a disruption does not count")
        check(all(workload(objs, "train-loom-" + m)["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
                  for m in ("preprocess", "encoder", "llm")),
              "jobs: a crashed worker or loom-preprocess restarts in its pod")
    # Kueue admits the Jobs (created suspended, labelled with the queue);
    # gang scheduling puts every pod in one PodGroup (all or none), valid
    # under the scheduler-plugins CRD's own schema.
    gang = os.path.join(TMP, "gang.yaml")
    open(gang, "w").write("""
workers: {ranksPerPod: 2}
job: {parallel: {encoder_dp: 2, llm_dp: 2, llm_tp: 2, microbatches: 2}}
workload:
  kueue: {queueName: gpu-queue, preferredTopology: cloud.example.com/rack}
  podGroup: {enabled: true, scheduleTimeoutSeconds: 900}
""")
    objs = check_render("gang", ["-f", gang], base + ["PodGroup/train-loom"])
    check_args("gang", objs)
    check_references("gang", objs)
    check_schemas("gang", objs)
    if objs:
        jobs = [o for o in objs if o["kind"] == "Job"]
        check(all(j["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == "gpu-queue" and
                  j["spec"].get("suspend") is True for j in jobs),
              "gang: every Job labelled with the Kueue queue and created suspended")
        check(all(workload(objs, "train-loom-" + m)["spec"]["template"]["metadata"].get("annotations", {}).get(
            "kueue.x-k8s.io/podset-preferred-topology") == "cloud.example.com/rack" for m in ("encoder", "llm")),
              "gang: each module's workers prefer one rack (Kueue topology-aware scheduling)")
        group = by(objs, "PodGroup", "train-loom")
        check(group["spec"] == {"minMember": 5, "scheduleTimeoutSeconds": 900},
              "gang: one PodGroup of every pod: scheduler, preprocess, 1 encoder pod, 2 LLM pods (%s)" %
              group["spec"])
        check(all(j["spec"]["template"]["metadata"]["labels"].get("scheduling.x-k8s.io/pod-group") ==
                  "train-loom" and j["spec"]["template"]["spec"].get("schedulerName") ==
                  "scheduler-plugins-scheduler" for j in jobs),
              "gang: every pod joins the PodGroup under the coscheduling scheduler")
        broken = json.loads(json.dumps(group))
        broken["spec"]["minMembers"] = broken["spec"].pop("minMember")
        errors = schema_errors(broken)
        check(any("minMembers" in e for e in errors),
              "gang: the PodGroup schema refuses a misspelled field (%s)" % errors)
    rc, out, err = render("-f", gang, "--set", "workers.schedulerName=volcano")
    check(rc != 0 and "a PodGroup's pods share one scheduler" in err,
          "gang: refuses a PodGroup under two schedulers (%s)" % (err.strip().splitlines()[-1] if err.strip() else ""))
    # workload.kind StatefulSet: Deployments and StatefulSets that serve on
    # after the job (more jobs by loomctl submit), as before.
    served = [o.replace("Job/train-loom-scheduler", "Deployment/train-loom-scheduler")
              .replace("Job/train-loom-preprocess", "Deployment/train-loom-preprocess")
              .replace("Job/", "StatefulSet/") for o in base]
    objs = check_render("serving workloads", ["--set", "workload.kind=StatefulSet"], served)
    check_references("serving workloads", objs)
    check_schemas("serving workloads", objs)
    check_locked_down("serving workloads", objs)
    if objs:
        ws = [o for o in objs if o["kind"] in WORKLOADS]
        check(not any("--exit_on_job_end" in containers(w)[0]["args"] for w in ws) and
              all(pods(w) == 2 for w in ws if w["kind"] == "StatefulSet") and
              all(w["spec"]["podManagementPolicy"] == "Parallel" for w in ws if w["kind"] == "StatefulSet"),
              "serving workloads: they serve on after the job; StatefulSets of Parallel pods")

    # One pod per node: 8 ranks per pod, each its own process on its own GPU
    # (--local_ranks), TP groups inside a pod, a port and a scrape per rank.
    per_node = os.path.join(TMP, "per-node.yaml")
    open(per_node, "w").write("""
serviceMonitor: {enabled: true}
workers: {ranksPerPod: 8}
job:
  parallel: {encoder_dp: 8, llm_tp: 4, llm_dp: 4, microbatches: 4}
  device: {encoder: cuda, llm: cuda, collectives: nccl}
""")
    objs = check_render("one pod per node", ["-f", per_node], base + ["ServiceMonitor/train-loom"])
    check_args("one pod per node", objs)
    check_references("one pod per node", objs)
    check_schemas("one pod per node", objs)
    check_locked_down("one pod per node", objs)
    if objs:
        for module, n in (("encoder", 1), ("llm", 2)):
            s = workload(objs, "train-loom-" + module)
            c = containers(s)[0]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            svc = {p["name"]: p["port"] for p in by(objs, "Service", "train-loom-" + module)["spec"]["ports"]}
            check(pods(s) == n and "--local_ranks=8" in c["args"] and
                  "--rank_from_hostname" in c["args"] and c["resources"]["limits"].get("nvidia.com/gpu") == 8,
                  "one pod per node: %s has %d pods of 8 ranks (--local_ranks=8) and 8 GPUs each" % (module, n))
            check(all(ports.get("grpc-%d" % i) == 50051 + i and ports.get("metrics-%d" % i) == 9090 + i and
                      svc.get("metrics-%d" % i) == 9090 + i for i in range(1, 8)),
                  "one pod per node: %s local ranks 1-7 on ports grpc+i and metrics+i, each scraped" % module)
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            check(mounts.get("shm") == "/dev/shm", "one pod per node: %s ranks share /dev/shm" % module)
        monitor = by(objs, "ServiceMonitor", "train-loom")
        check([e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"] + ["metrics-%d" % i for i in range(1, 8)],
              "one pod per node: the ServiceMonitor scrapes every local rank")
        rules = by(objs, "NetworkPolicy", "train-loom-llm-worker")["spec"]["ingress"]
        check(any(r.get("ports") == [{"port": 9090, "endPort": 9097, "protocol": "TCP"}] for r in rules),
              "one pod per node: metricsFrom reaches every local rank's metrics port")
    for what, args, named in [
        ("3 ranks per pod for 16 LLM ranks", ["-f", per_node, "--set", "workers.ranksPerPod=3"],
         "workers.ranksPerPod 3 must divide the encoder module's 8 ranks"),
        ("2 ranks per pod under TP 4", ["-f", per_node, "--set", "workers.ranksPerPod=2"],
         "workers.ranksPerPod 2 must be a multiple of parallel.llm_tp 4"),
        ("0 ranks per pod", ["--set", "workers.ranksPerPod=0"], "workers.ranksPerPod"),
    ]:
        rc, out, err = render(*args)
        check(rc != 0 and named in err, "one pod per node: refuses %s, naming it (%s)" %
              (what, err.strip().splitlines()[-1] if err.strip() else ""))

    # The schemas can fail: a misspelled field (the chart's values cannot
    # produce one) and a wrong type are found, named by their path.
    objs = check_render("defaults, again", [], base)
    if objs:
        broken = json.loads(json.dumps(workload(objs, "train-loom-llm")))
        c = broken["spec"]["template"]["spec"]["containers"][0]
        c["readinessProbe"]["exec"]["comand"] = c["readinessProbe"]["exec"].pop("command")
        errors = schema_errors(broken)
        check(any("comand" in e and "readinessProbe/exec" in e for e in errors),
              "the schemas refuse a misspelled field, naming its path (%s)" % errors)
        broken = json.loads(json.dumps(by(objs, "Service", "train-loom-scheduler")))
        broken["spec"]["ports"][0]["port"] = "fifty"
        errors = schema_errors(broken)
        check(any("spec/ports/0/port" in e for e in errors), "the schemas refuse a wrong type (%s)" % errors)
    objs = check_render("service monitor, again", ["--set", "serviceMonitor.enabled=true"],
                        base + ["ServiceMonitor/train-loom"])
    if objs:
        monitor = by(objs, "ServiceMonitor", "train-loom")
        check(not schema_errors(monitor), "the ServiceMonitor is valid under the operator's schema")
        for path, bad, named in [(["spec", "endpoints", 0], ("interval", "intervall"), "intervall"),
                                 (["spec", "namespaceSelector"], ("matchNames", "matchName"), "matchName"),
                                 (["spec", "endpoints", 0], ("scheme", None), "spec/endpoints/0/scheme")]:
            broken = json.loads(json.dumps(monitor))
            at = broken
            for p in path:
                at = at[p]
            if bad[1] is None:
                at[bad[0]] = "gopher"  # not an enum value
            else:
                at[bad[1]] = at.pop(bad[0])
            errors = schema_errors(broken)
            check(any(named in e for e in errors),
                  "the operator's schema refuses ServiceMonitor %s (%s)" % (named, errors))

    for what, args, named in [
        ("llm_dp 0", ["--set", "job.parallel.llm_dp=0"], "job.parallel.llm_dp"),
        ("llm_tp 0", ["--set", "job.parallel.llm_tp=0"], "job.parallel.llm_tp"),
        ("an env key without NCCL_", ["--set", "env.nccl.DEBUG=INFO"], "env.nccl"),
        ("a bad pull policy", ["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
        ("an unknown value", ["--set", "workers.encoder.replica=3"], "workers.encoder"),
        ("a bad job name", ["--set", "job.name=Big_Job"], "job.name"),
        ("a misspelled networkPolicy field", ["--set", "networkPolicy.controlfrom=x"], "networkPolicy"),
        ("a NetworkPolicy peer that is not one", ["-f", bad_peer], "networkPolicy.metricsFrom"),
        ("a misspelled tls field", ["--set", "tls.secret=x"], "tls"),
        ("an unknown identity's Secret", ["--set", "tls.secrets.admin=x"], "tls.secrets"),
        ("a bad tls refresh", ["--set", "tls.refresh=soon"], "tls.refresh"),
        ("a device that is none", ["--set", "job.device.llm=gpu"], "job.device.llm"),
        ("shards and sources both", ["-f", both], "job.data"),
        ("a source weight of 0", ["-f", zero_weight], "job.data.sources.0.weight"),
    ]:
        rc, out, err = render(*args)
        check(rc != 0 and named in err, "refuses %s, naming %s (%s)" % (what, named, err.strip().splitlines()[-1] if err.strip() else ""))


main()
finish()
