"""Schedules side by side: rounds of bench/schedules.sh, one run of each
schedule per round (A B C A B C ...), then per schedule the median step and
bubble, measured against predicted, its step over 1F1B's per round against
the simulator's ratio, and in how many runs the prediction was within 15%.
"Compute measured / predicted" is, per node, its stages' passes over the
simulated ones (the lowest and the highest node). "CPU wait" is the most
any node's threads waited for a CPU, as a share of its CPU time over its
life (schedules.sh's last lines): more than a few percent, and the nodes
were not each on a core of their own.

Run as root (after `make build`):
  /usr/bin/python3 bench/schedule_rounds.py --rounds 5 --nodes 2 --pin \\
      --schedules '1f1b;zb;interleaved --chunks 2;gpipe' -- TRAIN FLAGS...
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"step: predicted ([\d.]+) ms, measured ([\d.]+) ms .*bubble: predicted ([\d.]+)%, measured ([\d.]+)%")


def run(binary, port, nodes, flags, schedule, pin):
    env = dict(os.environ, NODES=str(nodes))
    if pin:
        env["PIN"] = "1"
    out = subprocess.run([f"{HERE}/schedules.sh", binary, str(port), "none"] + flags + ["--schedule"] + schedule.split(),
                         env=env, capture_output=True, text=True)
    m = LINE.search(out.stdout)
    if not m:
        sys.exit(f"{schedule}: no result:\n{out.stdout}{out.stderr}")
    plan = next((l for l in out.stdout.splitlines() if l.startswith("plan ")), "plan ?")
    waits = [int(w) for w in re.findall(r"waiting for one \((\d+)%\)", out.stdout)]
    busy = [float(x) for x in re.findall(r" x([\d.]+)", next((l for l in out.stdout.splitlines() if l.startswith("compute ")), ""))]
    return dict(busy=f"{min(busy):.2f}-{max(busy):.2f}" if busy else "?", pred=float(m[1]), meas=float(m[2]), pbub=float(m[3]), mbub=float(m[4]), plan=plan[5:].replace(", recomputing: none", ""),
                wait=max(waits, default=-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "bin", "ppnode"))
    ap.add_argument("--port", type=int, default=17400)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--schedules", default="1f1b;zb;interleaved --chunks 2;gpipe")
    ap.add_argument("--pin", action="store_true", help="node i on CPU i mod nproc only (schedules.sh PIN=1)")
    ap.add_argument("flags", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = [f for f in a.flags if f != "--"]
    scheds = a.schedules.split(";")
    res = {s: [] for s in scheds}
    print("| round | schedule | step measured (predicted) | bubble measured (predicted) | compute measured / predicted | CPU wait | plan |")
    print("|---|---|---|---|---|---|---|")
    for r in range(a.rounds):
        for s in scheds:
            x = run(a.binary, a.port, a.nodes, flags, s, a.pin)
            res[s].append(x)
            print(f"| {r + 1} | {s} | {x['meas']:.1f} ms ({x['pred']:.1f}) | {x['mbub']:.1f}% ({x['pbub']:.1f}%) | {x['busy']} | {x['wait']}% | `{x['plan']}` |", flush=True)
    base = scheds[0]
    for s in scheds:
        xs = res[s]
        line = (f"{s}: median step {statistics.median(x['meas'] for x in xs):.1f} ms (predicted {statistics.median(x['pred'] for x in xs):.1f}), "
                f"bubble {statistics.median(x['mbub'] for x in xs):.1f}% ({statistics.median(x['pbub'] for x in xs):.1f}%); "
                f"predicted within 15% in {sum(abs(x['pred'] / x['meas'] - 1) <= 0.15 for x in xs)} of {len(xs)} runs")
        if s != base:
            ratio = [x["meas"] / b["meas"] for x, b in zip(xs, res[base])]
            pratio = [x["pred"] / b["pred"] for x, b in zip(xs, res[base])]
            line += (f"; step / {base}'s per round: median {statistics.median(ratio):.3f} (range {min(ratio):.2f}-{max(ratio):.2f}), "
                     f"predicted {statistics.median(pratio):.3f}")
        print(line)


if __name__ == "__main__":
    main()
