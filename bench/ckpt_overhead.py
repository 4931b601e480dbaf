"""What consistent cuts cost at the default interval (at most 2% of training).
mlp32 on MNIST (8.3 M parameters: a cut with momentum is 66 MB, written on
the coordinator's node and copied to one other, the default 2 copies), no
re-planning.

1. End to end, side by side: two clusters of three nodes, each node a cgroup
   of 30% of a CPU, train the same job at the same time, one with the
   automatic interval, the other with no cut during training
   (--checkpoint-every larger than the job); the clusters swap roles every
   round. Running both at once exposes them to the same load from the rest
   of this shared machine, which made runs one after the other differ by
   up to 25% (see BENCHMARKS.md). The overhead is 1 - the throughputs'
   ratio, per round, and the median.
2. What one cut costs, on the first cluster while the other idles: short
   runs with a cut every 20 steps (two during training) against none,
   alternately; the cost is half the difference of their training times
   (median), and the overhead at the automatic interval follows as that cost
   over K median steps, K and the step as the automatic runs of part 1 had
   them.

Run as root (after `make build`):
  /usr/bin/python3 bench/ckpt_overhead.py [--rounds 4] [--steps 1500] [--cut-rounds 5]
"""
import argparse
import json
import os
import statistics
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import localtoken  # noqa: E402
import quota_plans  # noqa: E402
from paper_eval import Node, wait_members  # noqa: E402


def train(http, steps, every):
    return quota_plans.train(http, steps, "auto", ["--no-rebalance", "--checkpoint-every", str(every)])


def status(http, job):
    with localtoken.urlopen(f"http://{http}/v1/jobs/{job}") as r:
        return json.load(r)


def cluster(names, quota):
    nodes = [Node(names[0], quota)]
    for name in names[1:]:
        nodes.append(Node(name, quota, nodes[0].info["gossip"]))
    wait_members(nodes[0].info["http"], len(names))
    return nodes


def side_by_side(https, steps, everies):
    """Trains on every cluster at once; returns the results in order."""
    out = [None] * len(https)

    def run(i):
        out[i] = train(https[i], steps, everies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(https))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if None in out:
        raise SystemExit("a job failed")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--cut-rounds", type=int, default=5)
    a = ap.parse_args()
    none = 10 * a.steps
    nodes = []
    try:
        nodes = cluster("abc", 0.3) + cluster("def", 0.3)
        https = [nodes[0].info["http"], nodes[3].info["http"]]
        over, ks, step_ms = [], [], []
        print(f"1. {a.steps} steps on two clusters at once (nodes at 30% of a CPU), automatic interval against none\n")
        print("| round | cluster | interval | K | cuts | last cut: pause, written and copied, cost to the steps (ms) | samples/s | median step ms |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        side_by_side(https, 100, [none, none])  # warm-up, not measured
        for r in range(a.rounds):
            auto = r % 2  # the cluster with the automatic interval
            everies = [none, none]
            everies[auto] = 0
            res = side_by_side(https, a.steps, everies)
            for i, x in enumerate(res):
                st = status(https[i], x["id"])
                k = st.get("checkpoint_every", 0)
                if i == auto:
                    ks.append(k)
                    step_ms.append(x["measured_step_ms"])
                print(f"| {r + 1} | {'abc' if i == 0 else 'def'} | {'automatic' if i == auto else 'none'} | {k} | "
                      f"{st.get('cuts', 0)} | {st.get('checkpoint_ms', 0):.0f}, {st.get('persist_ms', 0):.0f}, "
                      f"{st.get('cut_cost_ms', 0):.0f} | "
                      f"{x['samples_per_sec']:.1f} | {x['measured_step_ms']:.1f} |", flush=True)
            over.append(1 - res[auto]["samples_per_sec"] / res[1 - auto]["samples_per_sec"])
        print(f"\noverhead at the automatic interval, side by side: median {100 * statistics.median(over):.1f}% "
              f"(rounds {', '.join(f'{100 * x:.1f}%' for x in over)}); automatic K median {statistics.median(ks):.0f}\n")
        if a.cut_rounds <= 0:
            return
        http = https[0]
        print("2. 60 steps on cluster abc (the other idle), a cut every 20 steps (at 20 and 40) against none\n")
        print("| round | with cuts s | without s | one cut s |")
        print("|---|---:|---:|---:|")
        costs = []
        train(http, 60, 1000)  # warm-up, not measured
        for r in range(a.cut_rounds):
            with_cuts = train(http, 60, 20)["seconds"]
            without = train(http, 60, 1000)["seconds"]
            costs.append((with_cuts - without) / 2)
            print(f"| {r + 1} | {with_cuts:.2f} | {without:.2f} | {costs[-1]:.2f} |", flush=True)
        cost, k, step = statistics.median(costs), statistics.median(ks), statistics.median(step_ms) / 1e3
        print(f"\none cut: median {cost:.2f} s; at the automatic K = {k:.0f} and a median step of {1e3 * step:.1f} ms "
              f"the overhead is {100 * cost / (k * step):.1f}% of the step time")
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    main()
