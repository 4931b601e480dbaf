"""Graph plans against chain plans on four nodes: the two-tower multi-modal
transformer and DLRM of python/ppnode_models.py train on four nodes of one
thread each, each held to half a CPU by a cgroup v1 quota (four nodes on
two cores: without quotas, one node's idle time is another's, and every
plan that keeps the CPUs busy takes the same time), with each partitioner;
the result's measured step (the median over the job) is compared. `ppnode
plan --compare` on the same model says which plans are chains (a stage
reads only the stage before it).

Run: /usr/bin/python3 bench/graph_vs_chain.py --ppnode /tmp/ppnode [--rounds 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import families  # noqa: E402

MODELS = {
    "twotower": ["--d=128", "--blocks=2", "--hidden=128"],
    "dlrm": ["--dense=256", "--tables=8", "--rows=4000", "--dim=64", "--bottom=512,256,64", "--top=512,256,2"],
}


def limit(pid, name, quota):
    """Holds pid to quota of a CPU with a cgroup v1 CPU quota (root only);
    returns the cgroup's directory, or None where it cannot."""
    d = f"/sys/fs/cgroup/cpu/ppnode-bench-{name}"
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(quota * 100000)))
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return d
    except OSError as e:
        print(f"no CPU quota for {name}: {e}", flush=True)
        return None


class Cluster4(families.Cluster):
    def __init__(self, ppnode, port, tmp, quota=0.5):
        self.groups = []
        self.procs, self.http = [], f"127.0.0.1:{port + 100}"
        for i, name in enumerate("abcd"):
            cmd = [ppnode, "join", "--name", name, "--bind", f"127.0.0.1:{port + i}", "--http", f"127.0.0.1:{port + 100 + i}",
                   "--data-dir", os.path.join(tmp, name), "--threads", "1", "--files", tmp]
            if i:
                cmd += ["--seeds", f"127.0.0.1:{port}"]
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, name + ".log"), "w")))
            if quota:
                self.groups.append(limit(self.procs[-1].pid, name, quota))
            self.wait(ppnode, i + 1)

    def stop(self):
        super().stop()
        for d in self.groups:
            if d:
                os.rmdir(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ppnode", default="/tmp/ppnode")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--partitions", default="graph,params,uniform,balanced")
    ap.add_argument("--port", type=int, default=17900)
    ap.add_argument("--quota", type=float, default=0.5, help="each node's share of a CPU (0: no quota)")
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="graphchain-")
    cluster = Cluster4(a.ppnode, a.port, tmp, a.quota)
    try:
        for model in a.models.split(","):
            opts = MODELS[model]
            d = os.path.join(tmp, model)
            subprocess.run([sys.executable, os.path.join(HERE, "..", "python", "export_models.py"), model, d] + opts,
                           check=True, capture_output=True)
            data = os.path.join(d, "data.npz")
            families.make_data(model, opts, data, n=1200)
            cmp = subprocess.run([a.ppnode, "plan", "--model", os.path.join(d, "model.onnx"), "--data", data,
                                  "--nodes", "a=1,b=1,c=1,d=1", "--batch", str(a.batch), "--micro-batches", str(a.micro_batches),
                                  "--compare"], capture_output=True, text=True)
            print(f"== {model}: ppnode plan --compare (simulated)\n{cmp.stdout.strip()}", flush=True)
            steps = {p: [] for p in a.partitions.split(",")}
            plans = {}
            for r in range(a.rounds):
                for p in steps:
                    run = subprocess.run([a.ppnode, "train", "--via", cluster.http, "--model", os.path.join(d, "model.onnx"),
                                          "--data", data, "--steps", str(a.steps), "--batch", str(a.batch),
                                          "--micro-batches", str(a.micro_batches), "--optimizer", "sgd", "--partition", p,
                                          "--json"], capture_output=True, text=True)
                    if run.returncode != 0:
                        print(f"{model} {p}: {run.stderr.strip()[-300:]}", flush=True)
                        continue
                    res = families.last_json(run.stdout)
                    steps[p].append(res["measured_step_ms"])
                    plans[p] = (res["plan"], res["schedule"], res.get("predicted_step_ms", 0))
                    print(f"{model} round {r + 1} {p}: measured {res['measured_step_ms']:.1f} ms, predicted "
                          f"{res.get('predicted_step_ms', 0):.1f} ms, {res['schedule']}, {res['plan']}", flush=True)
            med = {p: statistics.median(v) for p, v in steps.items() if v}
            print(f"{model} medians: " + ", ".join(f"{p} {v:.1f} ms" for p, v in med.items()), flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
