"""Where two nodes' step time goes: two one-thread nodes on 127.0.0.1 (as
bench/schedules.sh starts them; PIN=1: node a on CPU 0, b on CPU 1), one
job per schedule in turn, and for each:

- per step, from step 15 to the last polled before STEPS-10: each node's CPU time and its
  threads' waits on a run queue (/proc/PID/task/*/schedstat);
- over 5 s of steady steps from step 30: each busy thread's CPU and wait,
  in ms per second;
- the newest step's passes (GET /v1/jobs/ID: passes, predicted_passes) at
  that moment, measured and simulated, per stage: op and micro-batch @
  start + duration in ms (f forward, l loss, b backward, I input
  gradients, w weight gradients, r recomputation, s update).

CPU=F holds each node to F of a CPU (a cgroup v1 CFS quota of F x
PERIOD_US, default 100000, per period); then each step's line also gives
the CPU each node's stages computed (the newest step's passes) beside the
CPU the node used.

Run as root (after `make build`):
  [PIN=1] [CPU=F [PERIOD_US=P]] [ROUNDS=3] [STEPS=100] /usr/bin/python3 bench/node_waits.py [SCHEDULE...] [-- TRAIN FLAGS]
Schedules default to 1f1b and zb; train flags to mlp32 width 512, batch 256, 4 micro-batches.
"""
import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import localtoken  # noqa: E402

BIN = os.environ.get("BIN", os.path.join(HERE, "..", "bin", "ppnode"))
FLAGS = ("--model mlp32 --width 512 --data synthetic:28x28x1:10 --synthetic-samples 8192 --batch 256 "
         "--micro-batches 4 --partition uniform --threads 1 --optimizer sgd --momentum 0.9").split()
STEPS = int(os.environ.get("STEPS", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
CPU = float(os.environ.get("CPU", "0"))
PERIOD_US = int(os.environ.get("PERIOD_US", "100000"))
CGROUPS = []


def start(d, name, cpu, seeds):
    cmd = [BIN, "join", "--name", name, "--bind", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", "1",
           "--data-dir", "none", "--files", tempfile.gettempdir()]
    if os.environ.get("PIN"):
        cmd = ["taskset", "-c", str(cpu)] + cmd
    if CPU:
        cg = f"/sys/fs/cgroup/cpu/ppnode-waits-{os.getpid()}-{name}"
        os.makedirs(cg, exist_ok=True)
        CGROUPS.append(cg)
        with open(f"{cg}/cpu.cfs_period_us", "w") as f:
            f.write(str(PERIOD_US))
        with open(f"{cg}/cpu.cfs_quota_us", "w") as f:
            f.write(str(int(CPU * PERIOD_US)))
        cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg] + cmd
    if seeds:
        cmd += ["--seeds", seeds]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{d}/{name}.log", "w"), text=True)
    for line in p.stdout:
        if line.startswith("ready "):
            return p, json.loads(line[len("ready "):])
    raise SystemExit(f"node {name} did not start")


def api(http, path):
    with localtoken.urlopen(f"http://{http}{path}") as r:
        return json.load(r)


def threads(p):
    """CPU and run-queue wait in ns per thread of process p."""
    out = {}
    for f in glob.glob(f"/proc/{p.pid}/task/*/schedstat"):
        try:
            out[f.split("/")[4]] = list(map(int, open(f).read().split()[:2]))
        except OSError:
            pass
    return out


def totals(p):
    ts = threads(p).values()
    return sum(t[0] for t in ts) / 1e6, sum(t[1] for t in ts) / 1e6


def show(ps):
    short = {"backward_input": "I", "weight": "w", "step": "s"}
    return " ".join(f"{short.get(p['op'], p['op'][0])}{p['micro']}@{p['start_ms']:.1f}+{p['ms']:.1f}" for p in ps)


def submit(http, args):
    """Starts `ppnode train --via http --json ARGS`; returns the process and
    a dict that gets the job's id as "id" once train prints it."""
    pr = subprocess.Popen([BIN, "train", "--via", http, "--json"] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    box = {}

    def read_id():
        for line in pr.stderr:
            m = re.match(r"job (\S+):", line)
            if m:
                box["id"] = m.group(1)
    threading.Thread(target=read_id, daemon=True).start()
    return pr, box


def run(http, nodes, sched, flags):
    pr, box = submit(http, ["--steps", str(STEPS)] + flags + ["--schedule"] + sched.split())
    mark = end = None
    while pr.poll() is None:
        time.sleep(0.2)
        if "id" not in box:
            continue
        st = api(http, f"/v1/jobs/{box['id']}")
        step = st.get("step", 0)
        if mark is None and step >= 15:
            mark = (step, time.time(), [totals(p) for p in nodes])
        if mark and "snap" not in box and step >= 30:
            box["snap"] = True
            t0, s0 = time.time(), [threads(p) for p in nodes]
            time.sleep(5)
            dt, s1 = time.time() - t0, [threads(p) for p in nodes]
            for name, a, b in zip("ab", s0, s1):
                rows = sorted((((b[t][0] - a[t][0]) / 1e6 / dt, (b[t][1] - a[t][1]) / 1e6 / dt) for t in b if t in a), reverse=True)
                print(f"  node {name}, threads' CPU and wait, ms/s:", [(round(c), round(w)) for c, w in rows if c > 1 or w > 1])
            st = api(http, f"/v1/jobs/{box['id']}")
            for k, (ran, sim) in enumerate(zip(st.get("passes", []), st.get("predicted_passes", []))):
                print(f"  s{k} ran: {show(ran)}\n  s{k} sim: {show(sim)}")
                print(f"  s{k} computed {sum(p['ms'] for p in ran):.1f} ms of a {st['last_steps'][-1]['wall_ms']:.1f} ms step (simulated {sum(p['ms'] for p in sim):.1f})")
            continue  # step is from before the snapshot
        if mark and mark[0] < step <= STEPS - 10:
            end = (step, time.time(), [totals(p) for p in nodes])
    res = json.loads(pr.communicate()[0].splitlines()[-1])
    if end is None:
        raise SystemExit(f"{sched}: too few steps polled between step 15 and step {STEPS - 10}; raise STEPS")
    n = end[0] - mark[0]
    per = " ".join(f"{name} {(e[0] - m[0]) / n:.1f} / {(e[1] - m[1]) / n:.1f}" for name, m, e in zip("ab", mark[2], end[2]))
    print(f"{sched}: step {res['measured_step_ms']:.1f} ms (predicted {res['predicted_step_ms']:.1f}), {res['plan']}; "
          f"per step, CPU / run-queue wait (ms): {per}", flush=True)


@contextlib.contextmanager
def two_nodes():
    """Starts nodes a and b, waits until they see each other and yields
    a's HTTP address and the two processes; stops them after."""
    d = tempfile.mkdtemp()
    os.environ["PPNODE_TOKEN_FILE"] = d + "/http-token"
    nodes = []
    try:
        pa, ia = start(d, "a", 0, None)
        nodes.append(pa)
        pb, _ = start(d, "b", 1 % os.cpu_count(), ia["gossip"])
        nodes.append(pb)
        http = ia["http"]
        while sum(m["state"] == "alive" for m in api(http, "/v1/status")["members"]) < 2:
            time.sleep(0.1)
        yield http, nodes
    finally:
        for p in nodes:
            p.terminate()
        for p in nodes:
            p.wait()
        for cg in CGROUPS:
            os.rmdir(cg)


def main():
    args = sys.argv[1:]
    flags = FLAGS
    if "--" in args:
        flags, args = args[args.index("--") + 1:], args[:args.index("--")]
    scheds = args or ["1f1b", "zb"]
    with two_nodes() as (http, nodes):
        for _ in range(ROUNDS):
            for s in scheds:
                run(http, nodes, s, flags)


if __name__ == "__main__":
    main()
