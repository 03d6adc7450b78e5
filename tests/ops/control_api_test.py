"""The control API (loom.control.v1) from a second client written against the
proto alone: python3-grpcio with messages built from control.proto's
FileDescriptorSet, no generated code. It drives every call and every error
code of the API against a real `loom up --nosubmit` deployment (preprocess,
scheduler, one encoder and one LLM worker), and checks loomctl's exit codes.
It calls as an operator would: TLS trusting the job's CA, with the admin
bearer token `loom up` made; callers without credentials, with a read-only
token or with an unknown one are turned away as gRPC defines.

usage: control_api_test.py DESCRIPTOR_SET LOOM_UP BIN_DIR LOOMCTL TMPDIR
"""
import json
import os
import subprocess
import sys
import threading
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from ops_testing import LoomUp, check, finish
import ops_testing

DESCRIPTORS, LOOM_UP, BIN_DIR, LOOMCTL, TMP = sys.argv[1:6]
JOB = "ctl-test"
DEADLINE = 10  # seconds, every unary call

pool = descriptor_pool.DescriptorPool()
for f in descriptor_pb2.FileDescriptorSet.FromString(open(DESCRIPTORS, "rb").read()).file:
    pool.Add(f)
factory = message_factory.MessageFactory(pool)


def message(name):
    d = pool.FindMessageTypeByName(name)
    get = getattr(message_factory, "GetMessageClass", None)
    return get(d) if get else factory.GetPrototype(d)


C = "loom.control.v1."
STATE = {v.number: v.name for v in pool.FindEnumTypeByName(C + "JobState").values}
KIND = {v.number: v.name for v in pool.FindMessageTypeByName(C + "JobEvent").enum_types_by_name["Kind"].values}


class Control:
    def __init__(self, target, tls_dir, token_file=None, token=None):
        """TLS trusting TLS_DIR/ca.crt; the bearer token in TOKEN_FILE (or TOKEN) if given."""
        creds = grpc.ssl_channel_credentials(root_certificates=open(os.path.join(tls_dir, "ca.crt"), "rb").read())
        if token_file:
            token = open(token_file).read().strip()
        if token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        # The job's certificate names "loom" (loom up's default --tls_server_name).
        self.channel = grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "loom")])

    def call(self, method, **fields):
        req = message(C + method + "Request")(**fields)
        resp = message(C + method + "Response")
        rpc = self.channel.unary_unary("/loom.control.v1.ControlService/" + method,
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=resp.FromString)
        return rpc(req, timeout=DEADLINE)

    def watch(self, job_id, timeout):
        req = message(C + "WatchJobRequest")(job_id=job_id, after_iteration=-1)
        rpc = self.channel.unary_stream("/loom.control.v1.ControlService/WatchJob",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=message(C + "JobEvent").FromString)
        return rpc(req, timeout=timeout)


def expect_error(code, contains, fn, what):
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == code and contains in e.details(),
              "%s -> %s (%s)" % (what, e.code().name, e.details()))
        return
    check(False, "%s -> %s expected, call succeeded" % (what, code.name))


def wait_for(pred, what, seconds=120):
    v = ops_testing.wait_for(pred, seconds)
    if v is None:
        check(False, "timed out waiting for " + what)
    return v


def main():
    config_path = os.path.join(TMP, "job.json")
    config = {"name": JOB, "data": {"samples": 48, "global_batch": 8},
              "parallel": {"encoder_dp": 1, "llm_dp": 1, "microbatches": 2},
              "checkpoint": {"dir": os.path.join(TMP, "ckpt")}}
    with open(config_path, "w") as f:
        json.dump(config, f)
    with LoomUp(LOOM_UP, BIN_DIR, TMP, ["--config=" + config_path, "--nosubmit", "--noexit_on_job_end"]) as up:
        address_file = os.path.join(up.run_dir, "scheduler_address")
        target = wait_for(lambda: os.path.exists(address_file) and open(address_file).read().strip(),
                          "loom up to start the services", 300)
        if not target:
            return
        tls = os.path.join(up.run_dir, "tls")
        ctl = Control(target, tls, token_file=os.path.join(tls, "admin.token"))
        reader = Control(target, tls, token_file=os.path.join(tls, "read.token"))
        nobody = Control(target, tls)
        forger = Control(target, tls, token="f" * 64)
        G = grpc.StatusCode

        # Credentials: none or an unknown token -> UNAUTHENTICATED on every call;
        # a read-only token may read, not write.
        for method in ("SubmitJob", "GetJob", "PauseJob", "ResumeJob", "CheckpointJob", "CancelJob"):
            expect_error(G.UNAUTHENTICATED, "credentials", lambda: nobody.call(method, job_id=JOB)
                         if method != "SubmitJob" else nobody.call(method), method + " without credentials")
            expect_error(G.UNAUTHENTICATED, "unknown bearer token", lambda: forger.call(method, job_id=JOB)
                         if method != "SubmitJob" else forger.call(method), method + " with an unknown token")
        expect_error(G.UNAUTHENTICATED, "credentials", lambda: list(nobody.watch(JOB, DEADLINE)),
                     "WatchJob without credentials")
        expect_error(G.NOT_FOUND, JOB, lambda: reader.call("GetJob", job_id=JOB), "GetJob with the read token")
        expect_error(G.PERMISSION_DENIED, "read-only", lambda: reader.call("CancelJob", job_id=JOB),
                     "CancelJob with the read token")
        expect_error(G.PERMISSION_DENIED, "read-only", lambda: reader.call("SubmitJob"),
                     "SubmitJob with the read token")
        plain = grpc.insecure_channel(target)
        try:
            grpc.channel_ready_future(plain).result(timeout=5)
            check(False, "a plaintext client connects to a TLS scheduler")
        except grpc.FutureTimeoutError:
            check(True, "a plaintext client cannot connect")
        plain.close()

        # Before any job.
        expect_error(G.NOT_FOUND, JOB, lambda: ctl.call("GetJob", job_id=JOB), "GetJob before SubmitJob")
        expect_error(G.INVALID_ARGUMENT, "job_id", lambda: ctl.call("GetJob", job_id=""), "GetJob(\"\")")
        r = subprocess.run([LOOMCTL, "--scheduler=" + target, "--run_dir=" + up.run_dir, "get", JOB], capture_output=True, text=True)
        check(r.returncode == 1 and "NOT_FOUND" in r.stderr, "loomctl get before submit exits 1 with NOT_FOUND")

        JobSpec = message(C + "JobSpec")
        JobConfig = message("loom.job.v1.JobConfig")

        def spec(**changes):
            c = json.loads(json.dumps(config))
            for k, v in changes.items():
                if isinstance(v, dict):
                    c.setdefault(k, {}).update(v)
                else:
                    c[k] = v
            return JobSpec(config=json_format.ParseDict(c, JobConfig()))

        expect_error(G.INVALID_ARGUMENT, "job.config.parallel.llm_dp",
                     lambda: ctl.call("SubmitJob", job=spec(parallel={"llm_dp": -1})), "SubmitJob llm_dp -1")
        expect_error(G.INVALID_ARGUMENT, "job.config.name",
                     lambda: ctl.call("SubmitJob", job=spec(name="Not_A_Label")), "SubmitJob bad name")
        expect_error(G.INVALID_ARGUMENT, "job.config.algorithm",
                     lambda: ctl.call("SubmitJob", job=spec(algorithm="fastest")), "SubmitJob bad algorithm")
        expect_error(G.INVALID_ARGUMENT, "job", lambda: ctl.call("SubmitJob"), "SubmitJob without job")
        no_ckpt = spec()
        no_ckpt.resume = True
        expect_error(G.FAILED_PRECONDITION, "job.resume",
                     lambda: ctl.call("SubmitJob", job=no_ckpt), "SubmitJob resume without a checkpoint")

        job = ctl.call("SubmitJob", job=spec()).job
        check(job.job_id == JOB and STATE[job.state] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING"),
              "SubmitJob -> %s" % STATE[job.state])
        expect_error(G.ALREADY_EXISTS, JOB, lambda: ctl.call("SubmitJob", job=spec()), "SubmitJob again")
        expect_error(G.FAILED_PRECONDITION, JOB, lambda: ctl.call("SubmitJob", job=spec(name="other")),
                     "SubmitJob of a second job")
        expect_error(G.NOT_FOUND, "nope", lambda: ctl.call("PauseJob", job_id="nope"), "PauseJob unknown")
        expect_error(G.NOT_FOUND, "nope", lambda: ctl.call("CancelJob", job_id="nope"), "CancelJob unknown")
        expect_error(G.NOT_FOUND, "nope", lambda: next(iter(ctl.watch("nope", 10))), "WatchJob unknown")

        events = []
        watch_result = {}

        def watcher():
            try:
                for e in ctl.watch(JOB, 600):
                    events.append(e)
                watch_result["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                watch_result["code"] = e.code()
        t = threading.Thread(target=watcher)
        t.start()

        get = lambda: ctl.call("GetJob", job_id=JOB).job
        wait_for(lambda: get().completed_iterations >= 2, "2 iterations", 300)
        check(STATE[get().state] == "JOB_STATE_RUNNING", "GetJob -> RUNNING once both workers registered")
        expect_error(G.FAILED_PRECONDITION, "RUNNING", lambda: ctl.call("ResumeJob", job_id=JOB),
                     "ResumeJob of a running job")

        job = ctl.call("PauseJob", job_id=JOB).job
        check(STATE[job.state] == "JOB_STATE_PAUSED", "PauseJob -> PAUSED")
        expect_error(G.FAILED_PRECONDITION, "PAUSED", lambda: ctl.call("PauseJob", job_id=JOB), "PauseJob again")
        expect_error(G.FAILED_PRECONDITION, "PAUSED", lambda: ctl.call("CheckpointJob", job_id=JOB),
                     "CheckpointJob while paused")
        # Synchronised on the scheduler's counters, not on time: the iterations
        # handed out before the pause finish, then every worker asks for the
        # next one and is held; by then a broken pause would have handed it out.
        # (one computation may have passed the gate just before the pause).
        at_pause = job.assigned_iterations
        wait_for(lambda: get().paused_requests >= job.workers_expected, "every worker held by the pause", 120)
        assigned = get().assigned_iterations
        wait_for(lambda: get().completed_iterations >= assigned, "iterations before the pause finish", 120)
        held = get()
        check(assigned <= at_pause + 1 and held.assigned_iterations == assigned and
              held.completed_iterations == assigned,
              "no iteration handed out or finished while paused (%d assigned at the pause, %d once held; "
              "now %d assigned, %d done)" % (at_pause, assigned, held.assigned_iterations,
                                             held.completed_iterations))
        c2 = held.completed_iterations

        job = ctl.call("ResumeJob", job_id=JOB).job
        check(STATE[job.state] == "JOB_STATE_RUNNING", "ResumeJob -> RUNNING")
        wait_for(lambda: get().completed_iterations > c2, "progress after ResumeJob", 120)

        requested = ctl.call("CheckpointJob", job_id=JOB).step
        done = wait_for(lambda: [e for e in events if KIND[e.kind] == "KIND_CHECKPOINT"],
                        "the requested checkpoint", 120)
        if done:
            step = done[0].checkpoint_step
            check(requested == step, "CheckpointJob answered the step it completed (%d, then %d)" % (requested, step))
            path = os.path.join(TMP, "ckpt", "step-%d" % step, "COMPLETE")
            check(os.path.exists(path), "checkpoint %d complete on disk (%s)" % (step, path))
            check(get().last_checkpoint == step, "GetJob shows last_checkpoint %d" % step)

        r = subprocess.run([LOOMCTL, "--scheduler=" + target, "--run_dir=" + up.run_dir, "--json", "get", JOB], capture_output=True, text=True)
        check(r.returncode == 0 and json.loads(r.stdout)["job_id"] == JOB, "loomctl --json get")

        job = ctl.call("CancelJob", job_id=JOB, reason="control API test done").job
        check(STATE[job.state] == "JOB_STATE_CANCELLED" and job.message == "control API test done",
              "CancelJob -> CANCELLED with the reason")
        expect_error(G.FAILED_PRECONDITION, "CANCELLED", lambda: ctl.call("CancelJob", job_id=JOB), "CancelJob again")
        expect_error(G.FAILED_PRECONDITION, "CANCELLED", lambda: ctl.call("ResumeJob", job_id=JOB),
                     "ResumeJob of a cancelled job")
        r = subprocess.run([LOOMCTL, "--scheduler=" + target, "--run_dir=" + up.run_dir, "pause", JOB], capture_output=True, text=True)
        check(r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr, "loomctl pause of a cancelled job exits 1")
        job = get()
        check(STATE[job.state] == "JOB_STATE_CANCELLED", "GetJob after the end -> CANCELLED")

        t.join(60)
        check(not t.is_alive() and watch_result.get("code") == grpc.StatusCode.OK,
              "WatchJob ends by itself after the final state")
        kinds = [KIND[e.kind] for e in events]
        states = [STATE[e.job.state] for e in events if KIND[e.kind] == "KIND_STATE"]
        check(kinds[:1] == ["KIND_SNAPSHOT"], "WatchJob starts with a snapshot")
        check("KIND_STEP" in kinds and "KIND_CHECKPOINT" in kinds, "WatchJob streams steps and checkpoints")
        check(states[-3:] == ["JOB_STATE_PAUSED", "JOB_STATE_RUNNING", "JOB_STATE_CANCELLED"],
              "WatchJob state events %s" % states)
        up.process.send_signal(2)  # --noexit_on_job_end: Ctrl-C stops it
        rc = up.wait(120)
        check(rc == 0, "loom up stops every service and exits 0 on SIGINT (rc %s)" % rc)


main()
finish()
