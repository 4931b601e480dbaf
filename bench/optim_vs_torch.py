"""Training speed with each optimizer, ppnode against PyTorch: mlp32 width 512
on MNIST, batch 128 in one micro-batch, SGD with momentum 0.9 and Adam, run
alternately (ppnode, PyTorch, ppnode, ...) so that both see the same
machine; prints every run and the medians.

PyTorch trains the same model (bench/torch_train.py's mlp32: 784->512,
30x 512->512, 512->10, ReLU) with torch.optim.SGD(momentum=0.9) or
torch.optim.Adam, zero_grad(set_to_none=False) after each step as ppnode
zeroes its gradients, in its best configuration on these CPUs:
torch.set_num_threads(1), OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=2.

Run: /usr/bin/python3 bench/optim_vs_torch.py --ppnode /tmp/ppnode [--rounds 5] [--steps 200]
(ppnode built with `go build -tags openblas -o /tmp/ppnode ./cmd/ppnode`).
--ppnode takes name=path pairs, comma-separated, to alternate builds too:
--ppnode old=/tmp/ppnode.old,new=/tmp/ppnode.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_worker(a):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    from torch_train import mlp32

    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = mlp32(512, 784, 10)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    B = a.batch
    xs = torch.randn(8, B, 1, 28, 28)
    ys = torch.randint(0, 10, (8, B))
    start = time.time()
    for s in range(a.steps):
        loss = F.cross_entropy(model(xs[s % 8]), ys[s % 8])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    sec = time.time() - start
    print(json.dumps({"impl": "pytorch", "optimizer": a.optimizer, "steps": a.steps, "batch": B,
                      "samples_per_sec": a.steps * B / sec, "seconds": sec}))


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def run_ppnode(path, optimizer, steps, batch, threads):
    cmd = [path, "train", "--local", "--json", "--model", "mlp32", "--width", "512", "--data", "mnist",
           "--batch", str(batch), "--micro-batches", "1", "--optimizer", optimizer, "--steps", str(steps),
           "--threads", str(threads)]
    if optimizer == "sgd":
        cmd += ["--momentum", "0.9"]
    r = last_json(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["samples_per_sec"], r["weights_sha256"]


def run_torch(optimizer, steps, batch, threads):
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--worker", "--optimizer", optimizer,
           "--steps", str(steps), "--batch", str(batch)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS=str(threads))
    return last_json(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)["samples_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ppnode", default="/tmp/ppnode", help="path, or name=path pairs separated by commas")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return torch_worker(a)
    builds = [p.split("=", 1) if "=" in p else ["ppnode", p] for p in a.ppnode.split(",")]
    opts = a.optimizers.split(",")
    runs = {(o, name): [] for o in opts for name in [b[0] for b in builds] + ["pytorch"]}
    hashes = {}
    for r in range(a.rounds):
        for o in opts:
            for name, path in builds:
                sps, h = run_ppnode(path, o, a.steps, a.batch, a.threads)
                runs[(o, name)].append(sps)
                hashes.setdefault((o, name), set()).add(h)
                print("round %d %s %s %.1f samples/s (weights %s)" % (r, o, name, sps, h[:12]), flush=True)
            sps = run_torch(o, a.steps, a.batch, a.threads)
            runs[(o, "pytorch")].append(sps)
            print("round %d %s pytorch %.1f samples/s" % (r, o, sps), flush=True)
    print()
    print("| optimizer | implementation | samples/s (median) | vs PyTorch | runs |")
    print("| --- | --- | --- | --- | --- |")
    for o in opts:
        mt = statistics.median(runs[(o, "pytorch")])
        for name in [b[0] for b in builds] + ["pytorch"]:
            xs = runs[(o, name)]
            m = statistics.median(xs)
            print("| %s | %s | %.1f | %.2fx | %s |" % (o, name, m, m / mt, " ".join("%.0f" % v for v in xs)))
    for (o, name), hs in sorted(hashes.items()):
        print("weights %s %s: %s" % (o, name, " ".join(sorted(h[:16] for h in hs))))


if __name__ == "__main__":
    sys.exit(main())
