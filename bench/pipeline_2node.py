"""A 2-node pipeline with one CPU per node against one node with one CPU and
against PyTorch on the whole machine, run alternately (pipeline, single
node, PyTorch, pipeline, ...) so that all see the same machine; prints
every run and the medians.

  - 2 nodes: `ppnode join` twice, node a pinned to CPU 0 and node b to CPU 1
    (taskset, GOMAXPROCS=1, --threads 1); the job is submitted to node a,
    whose coordinator profiles the model there, plans it (auto partition and
    schedule at the given M) and reports the simulator's step time.
  - 1 node: `ppnode train --local --threads 1` pinned to CPU 0.
  - PyTorch 1.13 (Debian's, /usr/bin/python3): bench/torch_train.py on both
    CPUs, with 1 OpenMP thread + 2 OpenBLAS threads and with 2 + 1 (its two
    sensible splits here, see bench/train_vs_torch.py), and on one CPU; the
    best is its figure.

Run (after `make build`):
  /usr/bin/python3 bench/pipeline_2node.py [--rounds 3] [--steps 40] [--width 1024] [--micro-batches 8]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PPNODE = os.path.join(ROOT, "bin", "ppnode")


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def start_node(name, cpu, seeds=None):
    cmd = ["taskset", "-c", str(cpu), PPNODE, "join", "--name", name, "--bind", "127.0.0.1:0",
           "--http", "127.0.0.1:0", "--threads", "1"]
    if seeds:
        cmd += ["--seeds", seeds]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, GOMAXPROCS="1"))
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("ready "):
            return p, json.loads(line[len("ready "):])
    p.kill()
    raise SystemExit(f"node {name} did not become ready")


def wait_members(http, n):
    import localtoken
    deadline = time.time() + 30
    while time.time() < deadline:
        with localtoken.urlopen(f"http://{http}/v1/status") as r:
            st = json.load(r)
        alive = [m for m in st.get("members", []) if m.get("state", "alive") == "alive"]
        if len(alive) >= n:
            return
        time.sleep(0.2)
    raise SystemExit(f"cluster did not reach {n} members")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=float, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=8)
    a = ap.parse_args()
    common = ["--model", "mlp32", "--width", str(a.width), "--data", "mnist", "--batch", str(a.batch),
              "--micro-batches", str(a.micro_batches), "--steps", str(a.steps), "--optimizer", "sgd",
              "--momentum", "0.9", "--threads", "1", "--json"]
    torch_flags = ["--model", "mlp32", "--width", str(a.width), "--batch", str(a.batch),
                   "--micro-batches", str(a.micro_batches), "--steps", str(a.steps)]

    na, ia = start_node("a", 0)
    nb, ib = start_node("b", 1, ia["gossip"])
    try:
        wait_members(ia["http"], 2)
        rows = []
        for r in range(a.rounds):
            pipe = last_json(subprocess.run([PPNODE, "train", "--via", ia["http"]] + common, check=True,
                                            capture_output=True, text=True).stdout)
            single = last_json(subprocess.run(["taskset", "-c", "0", PPNODE, "train", "--local"] + common,
                                              check=True, capture_output=True, text=True).stdout)
            torch = {}
            for cpus, omp, blas in (("0,1", 1, 2), ("0,1", 2, 1), ("0", 1, 1)):
                env = dict(os.environ, OMP_NUM_THREADS=str(omp), OPENBLAS_NUM_THREADS=str(blas))
                out = subprocess.run(["taskset", "-c", cpus, "/usr/bin/python3", os.path.join(HERE, "torch_train.py"),
                                      "--threads", str(omp)] + torch_flags, check=True, capture_output=True,
                                     text=True, env=env).stdout
                torch[f"cpus {cpus} omp {omp} blas {blas}"] = last_json(out)["samples_per_sec"]
            best = max(torch, key=torch.get)
            row = {
                "plan": f'{pipe["plan"]} ({pipe["schedule"]}, M={pipe["micro_batches"]})',
                "pipe_sps": pipe["samples_per_sec"], "measured_ms": pipe["measured_step_ms"],
                "predicted_ms": pipe["predicted_step_ms"], "single_sps": single["samples_per_sec"],
                "torch_sps": torch[best], "torch_best": best, "torch_all": torch,
            }
            row["single_ms"] = single["measured_step_ms"]
            row["measured/predicted"] = row["measured_ms"] / row["predicted_ms"]
            # Steady state: median step times (the first steps allocate
            # and warm up; the pipeline also takes a cut at step 20).
            row["pipe/single"] = row["single_ms"] / row["measured_ms"]
            row["pipe/single overall"] = row["pipe_sps"] / row["single_sps"]
            row["pipe/torch steady"] = a.batch / (row["measured_ms"] / 1e3) / row["torch_sps"]
            row["pipe/torch"] = row["pipe_sps"] / row["torch_sps"]
            rows.append(row)
            print(json.dumps(row), flush=True)
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("pipe_sps", "measured_ms", "predicted_ms", "single_sps", "torch_sps",
                         "single_ms", "measured/predicted", "pipe/single", "pipe/single overall", "pipe/torch", "pipe/torch steady")}
        print("median", json.dumps(med))
    finally:
        for p in (nb, na):
            p.send_signal(signal.SIGTERM)
        for p in (nb, na):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
