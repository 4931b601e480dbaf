"""Balanced against uniform plans on unequal nodes: on 3 nodes with CPU quotas
of 100%, 50% and 25% of a CPU (cgroup v1), measured throughput of the
automatic plan against the uniform plan (equal layer counts), run
alternately.

Run as root (after `make build`):
  /usr/bin/python3 bench/quota_plans.py [--rounds 2] [--steps 40]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paper_eval import Node, PPNODE, wait_members  # noqa: E402


def train(http, steps, partition, extra):
    cmd = [PPNODE, "train", "--via", http, "--json", "--model", "mlp32", "--data", "mnist", "--batch", "128",
           "--micro-batches", "8", "--steps", str(steps), "--partition", partition, "--optimizer", "sgd",
           "--momentum", "0.9"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    nodes = [Node("a", 1.0)]
    try:
        nodes.append(Node("b", 0.5, nodes[0].info["gossip"]))
        nodes.append(Node("c", 0.25, nodes[0].info["gossip"]))
        http = nodes[0].info["http"]
        wait_members(http, 3)
        ratios, steady = [], []
        for r in range(a.rounds):
            uni = train(http, a.steps, "uniform", ["--no-rebalance"])
            first = train(http, a.steps, "auto", ["--no-rebalance"])
            auto = train(http, a.steps, "auto", [])
            ratios.append(auto["samples_per_sec"] / uni["samples_per_sec"])
            steady.append(uni["measured_step_ms"] / auto["measured_step_ms"])
            for name, res in (("uniform", uni), ("auto, first plan kept", first), ("auto", auto)):
                print(f"| {r + 1} | {name} | `{res['plan']}` ({res['schedule']}) | {res['samples_per_sec']:.0f} | "
                      f"{res['measured_step_ms']:.0f} | {res['predicted_step_ms']:.0f} |", flush=True)
        print(f"auto / uniform: overall {statistics.median(ratios):.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)}), "
              f"steady {statistics.median(steady):.2f} (runs {', '.join(f'{x:.2f}' for x in steady)})")
    finally:
        for n in reversed(nodes):
            n.stop()


if __name__ == "__main__":
    sys.exit(main())
