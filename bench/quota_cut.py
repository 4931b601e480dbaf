"""Rebalancing after a CPU quota cut: on 3 nodes (CPU quotas 60% of a CPU
each), one node's quota is cut to 25% at step CUT of a running job; the
throughput over the 20 steps from CUT+20 is compared with a fresh job
started on nodes that have those quotas from the beginning (its measured
throughput over the same steps, and its plan's predicted step time). Runs
alternate: cut, fresh, cut, fresh, ...; medians are reported. mlp32 width
512 on MNIST, the default two copies of each cut.

Run as root (after `make build`):
  /usr/bin/python3 bench/quota_cut.py [--rounds 3] [--cut 20] [--steps 80]
"""
import argparse
import json
import statistics
import sys
import os
import time
import urllib.request

import localtoken

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paper_eval import Node, wait_members  # noqa: E402

SPEC = {"model": "mlp32", "width": 512, "data": "mnist", "batch": 128, "micro_batches": 8, "epochs": 1,
        "optimizer": "sgd", "momentum": 0.9, "partition": "auto", "standardize": True}


def submit(http, spec):
    req = urllib.request.Request(f"http://{http}/v1/jobs", data=json.dumps(spec).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with localtoken.urlopen(req) as r:
        return json.load(r)["id"]


def status(http, job):
    with localtoken.urlopen(f"http://{http}/v1/jobs/{job}") as r:
        return json.load(r)


def run(quotas, steps, cut=None):
    """Runs one job on fresh nodes; returns {step: first time seen}, the
    last status and the status at the cut."""
    nodes = [Node("a", quotas[0])]
    at, cut_status = {}, None
    try:
        for name, q in zip("bc", quotas[1:]):
            nodes.append(Node(name, q, nodes[0].info["gossip"]))
        http = nodes[0].info["http"]
        wait_members(http, 3)
        job = submit(http, dict(SPEC, steps=steps))
        while True:
            st = status(http, job)
            at.setdefault(st["step"], time.monotonic())
            if cut is not None and cut_status is None and st["step"] >= cut:
                with open(f"{nodes[1].cg}/cpu.cfs_quota_us", "w") as f:
                    f.write("25000")
                cut_status = st
            if st["state"] in ("done", "failed"):
                if st["state"] == "failed":
                    raise SystemExit(f"job failed: {st.get('error')}")
                return at, st, cut_status
            time.sleep(0.01)
    finally:
        for n in nodes:
            n.stop()


def rate(at, a, b):
    """Steps per second from the first step seen at or after a to the last
    seen at or before b."""
    s0 = min(s for s in at if s >= a)
    s1 = max(s for s in at if s <= b)
    return (s1 - s0) / (at[s1] - at[s0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cut", type=int, default=20)
    ap.add_argument("--steps", type=int, default=80)
    a = ap.parse_args()
    lo, hi = a.cut + 20, a.cut + 40
    if a.steps < hi:
        raise SystemExit(f"--steps must be at least {hi}")
    vs_fresh, vs_pred = [], []
    print("| round | run | plan at the end | re-plans | steps/s over steps %d-%d | predicted steps/s |" % (lo, hi))
    print("|---|---|---|---|---:|---:|")
    for r in range(a.rounds):
        at, st, cst = run([0.6, 0.6, 0.6], a.steps, cut=a.cut)
        cut_rate = rate(at, lo, hi)
        replans = ", ".join(f"step {p['step']} (gain {p['gain']:.2f}; speeds " +
                            " ".join(f"{n}={v:.2f}" for n, v in sorted(p["speeds"].items())) + ")"
                            for p in st.get("replans", []))
        print(f"| {r + 1} | quota of b cut at step {cst['step']} | `{st['plan']}` | {replans or 'none'} | "
              f"{cut_rate:.2f} | |", flush=True)
        at, st, _ = run([0.6, 0.25, 0.6], a.steps)
        fresh_rate = rate(at, lo, hi)
        pred_rate = 1000 / st["predicted_step_ms"]
        print(f"| {r + 1} | fresh, b at 25% from the start | `{st['plan']}` | {len(st.get('replans', []))} | "
              f"{fresh_rate:.2f} | {pred_rate:.2f} |", flush=True)
        vs_fresh.append(cut_rate / fresh_rate)
        vs_pred.append(cut_rate / pred_rate)
    print(f"after the cut / fresh plan measured: median {statistics.median(vs_fresh):.2f} "
          f"({', '.join(f'{x:.2f}' for x in vs_fresh)}); / fresh plan predicted: median "
          f"{statistics.median(vs_pred):.2f} ({', '.join(f'{x:.2f}' for x in vs_pred)})")


if __name__ == "__main__":
    main()
