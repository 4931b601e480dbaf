"""Issue 6, acceptance 2: what consistent cuts cost at the default interval.
The same job (mlp32 on MNIST over 3 nodes, each a cgroup of 60% of a CPU)
runs with the automatic checkpoint interval and with none during training
(--checkpoint-every larger than the job), alternately; the overhead is the
difference of the training throughputs, per pair, and the median of those.

Run as root (after `make build`):
  /usr/bin/python3 bench/ckpt_overhead.py [--rounds 3] [--steps 300]
"""
import argparse
import json
import os
import statistics
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quota_plans  # noqa: E402
from paper_eval import Node, wait_members  # noqa: E402


def train(http, steps, every):
    return quota_plans.train(http, steps, "auto", ["--no-rebalance", "--checkpoint-every", str(every)])


def status(http, job):
    with urllib.request.urlopen(f"http://{http}/v1/jobs/{job}") as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    nodes = [Node("a", 0.6)]
    try:
        nodes.append(Node("b", 0.6, nodes[0].info["gossip"]))
        nodes.append(Node("c", 0.6, nodes[0].info["gossip"]))
        http = nodes[0].info["http"]
        wait_members(http, 3)
        over = []
        print("| round | interval | cuts | last cut cost ms | samples/s | median step ms |")
        print("|---|---|---:|---:|---:|---:|")
        for r in range(a.rounds):
            got = {}
            for name, every in (("automatic", 0), ("none", 10 * a.steps)):
                res = train(http, a.steps, every)
                st = status(http, res["id"])
                got[name] = res
                print(f"| {r + 1} | {name} | {st.get('cuts', 0)} | {st.get('checkpoint_ms', 0):.0f} | "
                      f"{res['samples_per_sec']:.1f} | {res['measured_step_ms']:.1f} |", flush=True)
            over.append(1 - got["automatic"]["samples_per_sec"] / got["none"]["samples_per_sec"])
        print(f"overhead of cuts at the automatic interval: median {100 * statistics.median(over):.1f}% "
              f"(rounds {', '.join(f'{100 * x:.1f}%' for x in over)})")
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    main()
