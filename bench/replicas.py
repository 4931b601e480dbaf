"""Replicated stages on equal and unequal nodes (cgroup v1 CPU quotas).

For each model, the throughput of the automatic plan on the whole cluster
against one node's (the same job with --max-nodes 1 on a node of the
largest quota): steady (the ratio of the median step times, what a long
job gets) and over the whole run (samples/s, start-up and planning
included); the simulator's predicted step against the measured one; and
the share of CPU-quota periods in which a node of the cluster used all its
quota (median over the nodes: near 1, the cluster is bound by its CPUs);
and the machine's CPU use during the cluster's steps (1: both cores busy).
With --base, a second binary (the version before replicated stages) runs
the same jobs on a cluster of its own; head and base clusters
alternate round after round, and the script prints each round and the
medians.

Models: mlp32 (MNIST) and a 4-layer MLP, 784 -> 1024 -> 1024 -> 1024 -> 10,
exported from PyTorch to ONNX (random data, 4096 samples): four layers
make at most four stages, so only replicas can use more nodes.

Run as root (after `make build`):
  /usr/bin/python3 bench/replicas.py [--quotas 0.25x8] [--base /tmp/ppnode-base] [--rounds 3] [--steps 30]
  /usr/bin/python3 bench/replicas.py --quotas 1,0.5,0.25,0.25,0.125
The one-node run trains the whole batch as one micro-batch (--one-micro).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paper_eval  # noqa: E402
from paper_eval import Node, wait_members  # noqa: E402


def mlp4_files(d):
    """Writes mlp4.onnx and mlp4.npz into d."""
    import numpy as np
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    torch.onnx.export(m, torch.zeros(1, 784), f"{d}/mlp4.onnx", input_names=["x"], dynamic_axes={"x": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=13)
    rng = np.random.default_rng(0)
    np.savez(f"{d}/mlp4.npz", x=rng.standard_normal((4096, 784), dtype=np.float32), y=rng.integers(0, 10, 4096))
    return ["--model", f"{d}/mlp4.onnx", "--data", f"{d}/mlp4.npz"]


def machine_cpu():
    """Total and idle jiffies of the machine (/proc/stat)."""
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(v), v[3] + v[4]


def train(ppnode, http, flags, steps, micro, max_nodes):
    """Runs a job; the result has "busy": the machine's CPU use during its
    steps (median of 0.5 s samples from the first to the last at half the
    run's highest or more: planning and the final evaluation, which run on
    the coordinator's node alone, are left out)."""
    cmd = [ppnode, "train", "--via", http, "--json", "--steps", str(steps), "--batch", "256", "--micro-batches", str(micro),
           "--optimizer", "sgd", "--momentum", "0.9", "--no-rebalance", "--max-nodes", str(max_nodes)] + flags
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy, (t0, i0) = [], machine_cpu()
    while True:
        try:
            out, err = p.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            t1, i1 = machine_cpu()
            busy.append(1 - (i1 - i0) / max(t1 - t0, 1))
            t0, i0 = t1, i1
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {err}")
    res = json.loads(out.strip().splitlines()[-1])
    hot = [i for i, b in enumerate(busy) if b >= max(busy, default=0) / 2]
    res["busy"] = statistics.median(busy[hot[0]:hot[-1] + 1]) if hot else float("nan")
    return res


def throttle_stats(nodes):
    """Periods and throttled periods of each node's cgroup (cpu.stat)."""
    out = []
    for n in nodes:
        st = dict(line.split() for line in open(f"{n.cg}/cpu.stat"))
        out.append((int(st["nr_periods"]), int(st["nr_throttled"])))
    return out


def quotas_of(s):
    if "x" in s:
        q, n = s.split("x")
        return [float(q)] * int(n)
    return [float(q) for q in s.split(",")]


def round_on(ppnode, quotas, models, steps, micro, one_micro):
    """Starts a cluster of ppnode nodes with quotas, runs every model on one
    node (in one_micro micro-batches) and on all of them, stops the cluster."""
    paper_eval.PPNODE = ppnode
    nodes = []
    out = {}
    try:
        for i, q in enumerate(quotas):
            nodes.append(Node(chr(ord("a") + i), q, nodes[0].info["gossip"] if nodes else None))
        http = nodes[0].info["http"]
        wait_members(http, len(nodes))
        for name, flags in models.items():
            one = train(ppnode, http, flags, steps, one_micro, 1)
            before = throttle_stats(nodes)
            full = train(ppnode, http, flags, steps, micro, len(nodes))
            after = throttle_stats(nodes)
            # The share of quota periods in which a node used all its quota,
            # median over the nodes: near 1, the cluster is bound by its CPUs.
            full["throttled"] = statistics.median(
                (t1 - t0) / max(p1 - p0, 1) for (p0, t0), (p1, t1) in zip(before, after))
            out[name] = (one, full)
    finally:
        for n in nodes:
            n.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quotas", default="0.25x8")
    ap.add_argument("--ppnode", default=paper_eval.PPNODE)
    ap.add_argument("--base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--micro", default="16", help="the cluster's micro-batches: a number or auto")
    # A node alone has no pipeline to fill: by default its run is the whole
    # batch at once, its fastest (--one-micro 0: the same as --micro).
    ap.add_argument("--one-micro", default="1")
    ap.add_argument("--models", default="mlp32,mlp4")
    ap.add_argument("--period-ms", type=float, default=100, help="the CFS period of the quotas")
    a = ap.parse_args()
    paper_eval.PERIOD_US = int(a.period_ms * 1000)
    quotas = quotas_of(a.quotas)
    d = tempfile.mkdtemp(prefix="ppnode-bench-replicas-")
    try:
        all_models = {"mlp32": ["--model", "mlp32", "--data", "mnist"]}
        if "mlp4" in a.models:
            all_models["mlp4"] = mlp4_files(d)
        models = {m: all_models[m] for m in a.models.split(",")}
        bins = [("head", a.ppnode)] + ([("base", a.base)] if a.base else [])
        # The sum of the nodes' speeds in units of the node of the largest quota.
        speeds = sum(quotas) / max(quotas)
        res = {}
        print("| round | binary | model | one node step ms | cluster step ms | steady ratio | x sum of speeds | whole-run samples/s, one / cluster | plan | predicted ms | throttled | machine busy |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in range(a.rounds):
            for label, binary in bins:
                for name, (one, full) in round_on(binary, quotas, models, a.steps, a.micro, a.one_micro if a.one_micro != "0" else a.micro).items():
                    ratio = one["measured_step_ms"] / full["measured_step_ms"]
                    whole = full["samples_per_sec"] / one["samples_per_sec"]
                    res.setdefault((label, name), []).append((ratio, full["predicted_step_ms"] / full["measured_step_ms"], whole))
                    print(f"| {r + 1} | {label} | {name} | {one['measured_step_ms']:.1f} | {full['measured_step_ms']:.1f} | {ratio:.2f} | "
                          f"{ratio / speeds:.2f} | {one['samples_per_sec']:.0f} / {full['samples_per_sec']:.0f} ({whole:.2f}) | "
                          f"`{full['plan']}` ({full.get('schedule', '?')}, M={full.get('micro_batches', '?')}) | {full['predicted_step_ms']:.1f} | {full['throttled']:.2f} | {full['busy']:.2f} |",
                          flush=True)
        for (label, name), rs in sorted(res.items()):
            ratios = [x for x, _, _ in rs]
            preds = [p for _, p, _ in rs]
            wholes = [w for _, _, w in rs]
            print(f"{label} {name}: cluster / one node, steady, median {statistics.median(ratios):.2f} "
                  f"({statistics.median(ratios) / speeds:.2f} of the sum of the speeds, {speeds:g}); whole run "
                  f"{statistics.median(wholes):.2f}; predicted / measured step median {statistics.median(preds):.2f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
