"""The seed paper's evaluation on this machine.

Speedup of pipelined training against micro-batch count M (1, 2, 4, 8, 16)
and stage count S (1 to 4) for mlp32, vgg16 and resnet50 at CPU sizes,
measured and simulated side by side. S machines are emulated by S `ppnode
join` processes that get 2/S of a CPU each (cgroup v1 cpu.cfs_quota_us,
root only); the baseline is one node with the same quota training without a
pipeline (one stage, M = 1). Partitions are uniform (equal layer counts, as
in the paper) and the schedule GPipe.

  measured speedup  = baseline's measured step time / the pipeline's
  simulated speedup = baseline's predicted step time / the pipeline's
                      (predictions: the coordinator's simulator, from the
                      layer profile it measures on its own node under the
                      same quota)

Run as root (after `make build`):
  /usr/bin/python3 bench/paper_eval.py [--models mlp32,vgg16,resnet50] [--stages 1,2,3,4] [--micro 1,2,4,8,16]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import localtoken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PPNODE = os.path.join(ROOT, "bin", "ppnode")
CG = "/sys/fs/cgroup/cpu"
# The CFS period of the nodes' quotas: a node of quota q runs q * PERIOD_US
# and then waits out the rest of each period.
PERIOD_US = 100000
# PIN: a node holds to one CPU, the n-th node started to CPU n mod nproc
# (taskset), so that the kernel does not move nodes between cores.
PIN = bool(os.environ.get("PIN"))
_started = 0

MODELS = {
    # model: (flags, steps)
    "mlp32": (["--model", "mlp32", "--data", "mnist", "--batch", "128"], 12),
    "vgg16": (["--model", "vgg16", "--width", "0.25", "--data", "mnist", "--batch", "64"], 4),
    "resnet50": (["--model", "resnet50", "--width", "0.25", "--data", "synthetic:32x32x3:10",
                  "--synthetic-samples", "512", "--batch", "32"], 4),
}


class Node:
    def __init__(self, name, quota, seeds=None):
        self.cg = f"{CG}/ppnode-bench-{os.getpid()}-{name}"
        os.makedirs(self.cg, exist_ok=True)
        with open(f"{self.cg}/cpu.cfs_period_us", "w") as f:
            f.write(str(PERIOD_US))
        with open(f"{self.cg}/cpu.cfs_quota_us", "w") as f:
            f.write(str(int(PERIOD_US * quota)))
        threads = max(1, round(quota))
        # A checkpoint store of its own (the default one, under the user's
        # state directory, is shared by every node of that name), removed
        # in stop().
        self.data = tempfile.mkdtemp(prefix=f"ppnode-bench-{name}-")
        cmd = [PPNODE, "join", "--name", name, "--bind", "127.0.0.1:0", "--http", "127.0.0.1:0",
               "--threads", str(threads), "--data-dir", self.data, "--files", tempfile.gettempdir()]
        if seeds:
            cmd += ["--seeds", seeds]
        if os.environ.get("PPNODE_NODE_LOG"):
            cmd += ["--log-level", "debug"]
        # The child moves itself into the cgroup before exec, so every
        # thread it starts is limited.
        global _started
        if PIN:
            cmd = ["taskset", "-c", str(_started % os.cpu_count())] + cmd
        _started += 1
        self.p = subprocess.Popen(["sh", "-c", f'echo $$ > {self.cg}/cgroup.procs && exec "$@"', "sh"] + cmd,
                                  stdout=subprocess.PIPE, stderr=open(os.environ.get("PPNODE_NODE_LOG", os.devnull) + (("." + name) if os.environ.get("PPNODE_NODE_LOG") else ""), "w"), text=True,
                                  env=dict(os.environ, GOMAXPROCS=str(threads)))
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.p.stdout.readline()
            if not line:
                break
            if line.startswith("ready "):
                self.info = json.loads(line[len("ready "):])
                return
        self.stop()
        raise SystemExit(f"node {name} did not become ready")

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        shutil.rmtree(self.data, ignore_errors=True)
        for _ in range(50):
            try:
                os.rmdir(self.cg)
                return
            except OSError:
                time.sleep(0.1)


def wait_members(http, n):
    deadline = time.time() + 30
    while time.time() < deadline:
        with localtoken.urlopen(f"http://{http}/v1/status") as r:
            st = json.load(r)
        if len([m for m in st.get("members", []) if m.get("state", "alive") == "alive"]) >= n:
            return
        time.sleep(0.2)
    raise SystemExit(f"cluster did not reach {n} members")


def train(http, flags, steps, M, partition, max_nodes):
    cmd = [PPNODE, "train", "--via", http, "--json", "--steps", str(steps), "--micro-batches", str(M),
           "--partition", partition, "--schedule", "gpipe", "--max-nodes", str(max_nodes),
           "--optimizer", "sgd", "--momentum", "0.9"] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp32,vgg16,resnet50")
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--micro", default="1,2,4,8,16")
    ap.add_argument("--steps-scale", type=float, default=1.0)
    a = ap.parse_args()
    if not os.access(f"{CG}/cgroup.procs", os.W_OK):
        raise SystemExit("needs root and cgroup v1 at " + CG)
    print("| model | S | M | measured speedup | simulated speedup | measured step ms | predicted step ms | plan |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for model in a.models.split(","):
        flags, steps = MODELS[model]
        steps = max(2, int(steps * a.steps_scale))
        for S in map(int, a.stages.split(",")):
            quota = 2 / S
            nodes = [Node("n0", quota)]
            try:
                for i in range(1, S):
                    nodes.append(Node(f"n{i}", quota, nodes[0].info["gossip"]))
                http = nodes[0].info["http"]
                wait_members(http, S)
                base = train(http, flags, steps, 1, "uniform", 1)
                bm, bp = base["measured_step_ms"], base["predicted_step_ms"]
                print(f"| {model} | 1 (baseline, {quota:.2f} CPU) | 1 | 1.00 | 1.00 | {bm:.1f} | {bp:.1f} | {base['plan']} |", flush=True)
                for M in map(int, a.micro.split(",")):
                    r = train(http, flags, steps, M, "uniform", S)
                    print(f"| {model} | {S} | {M} | {bm / r['measured_step_ms']:.2f} | {bp / r['predicted_step_ms']:.2f} | "
                          f"{r['measured_step_ms']:.1f} | {r['predicted_step_ms']:.1f} | {r['plan']} |", flush=True)
            finally:
                for n in reversed(nodes):
                    n.stop()


if __name__ == "__main__":
    sys.exit(main())
