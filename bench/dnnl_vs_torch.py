"""Convolutional training speed, ppnode against PyTorch on the same model,
batch, micro-batches and optimizer, run alternately (A B A B ...) so that
both see the same (shared, noisy) machine.

Both train on random 32x32x3 images of 10 classes with SGD (momentum 0.9),
batch 32, in 1 or M micro-batches whose gradients are accumulated before
the step. PyTorch runs the modules of python/ppnode_models.py (ResNet50,
VGG16: the zoo's models) in each configuration of --torch (OpenMP threads,
"cl" for channels_last memory format); its best median counts. Each run
reports samples/s over all its steps (the first, which builds oneDNN's
primitives in both, included) and the median step time, the steadier
figure on a shared machine.

Run (after building ppnode with oneDNN):
    go build -tags 'openblas dnnl' -o /tmp/ppnode-dnnl ./cmd/ppnode
    /usr/bin/python3 bench/dnnl_vs_torch.py --ppnode /tmp/ppnode-dnnl [--rounds 5] [--steps 30]
A second binary (--baseline, for example one built without the dnnl tag) is
run in the same rotation.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = [
    # name, model, micro-batches
    ("resnet50", "resnet50", 1),
    ("vgg16", "vgg16", 1),
    ("resnet50 4 micro", "resnet50", 4),
]


def run_ppnode(binary, model, micro, steps, batch, threads):
    cmd = [binary, "train", "--local", "--json", "--model", model, "--width", "0.25", "--data", "synthetic:32x32x3:10",
           "--batch", str(batch), "--micro-batches", str(micro), "--optimizer", "sgd", "--steps", str(steps),
           "--synthetic-samples", "1024", "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["samples_per_sec"], r["measured_step_ms"], r["backend"]


def run_torch(model, micro, steps, batch, omp, channels_last):
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--torch-worker", "--model", model, "--micro", str(micro),
           "--steps", str(steps), "--batch", str(batch)] + (["--channels-last"] if channels_last else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(omp), OPENBLAS_NUM_THREADS=str(omp))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["samples_per_sec"], r["median_step_ms"], "torch"


def torch_worker(a):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(ROOT, "python"))
    import ppnode_models as pm

    torch.manual_seed(1)
    if a.model == "resnet50":
        model = pm.ResNet50(0.25, 3, 10)
    else:
        model = pm.VGG16(0.25, (32, 32, 3), 10)
    model.train()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    B, M = a.batch, a.micro
    xs = torch.randn(8, B, 3, 32, 32)
    ys = torch.randint(0, 10, (8, B))
    sizes = [B // M + (1 if m < B % M else 0) for m in range(M)]
    times = []
    start = time.time()
    for s in range(a.steps):
        t0 = time.time()
        x, y = xs[s % 8].contiguous(memory_format=fmt), ys[s % 8]
        lo = 0
        for n in sizes:
            loss = F.cross_entropy(model(x[lo:lo + n]), y[lo:lo + n], reduction="sum") / B
            loss.backward()
            lo += n
        opt.step()
        opt.zero_grad(set_to_none=False)
        times.append(time.time() - t0)
    sec = time.time() - start
    print(json.dumps({"samples_per_sec": a.steps * B / sec, "median_step_ms": 1e3 * statistics.median(times),
                      "threads": torch.get_num_threads()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ppnode", default=os.path.join(ROOT, "bin", "ppnode"))
    ap.add_argument("--baseline", default="", help="another ppnode binary run in the same rotation")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(w[0] for w in WORKLOADS))
    ap.add_argument("--torch", default="2,2cl,1cl", help="PyTorch configurations: OpenMP threads, cl for channels_last")
    ap.add_argument("--torch-worker", action="store_true")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--channels-last", action="store_true")
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    want = a.workloads.split(",")
    print("| workload | ppnode samples/s | ppnode step ms | PyTorch samples/s | PyTorch step ms | ratio (samples/s) | ratio (step) |"
          + (" baseline samples/s | baseline step ms |" if a.baseline else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if a.baseline else ""))
    for name, model, micro in WORKLOADS:
        if name not in want:
            continue
        configs = ["torch" + c for c in a.torch.split(",")]
        runs = {k: [] for k in ["ppnode"] + configs + ["baseline"]}
        for r in range(a.rounds):
            # ppnode, then PyTorch's configurations and the baseline in turn.
            runs["ppnode"].append(run_ppnode(a.ppnode, model, micro, a.steps, a.batch, a.threads))
            for i, c in enumerate(configs):
                omp = int(c[len("torch"):].rstrip("cl"))
                runs[c].append(run_torch(model, micro, a.steps, a.batch, omp, c.endswith("cl")))
                if i == 0 and a.baseline:
                    runs["baseline"].append(run_ppnode(a.baseline, model, micro, a.steps, a.batch, a.threads))
            print("# %s round %d: %s" % (name, r + 1, {k: [("%.1f/s %.0fms" % v[:2]) for v in vs] for k, vs in runs.items() if vs}),
                  file=sys.stderr, flush=True)
        med = {k: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs)) for k, vs in runs.items() if vs}
        best = max(configs, key=lambda k: med[k][0])
        p, t = med["ppnode"], med[best]
        row = "| %s (%s) | %.1f | %.0f | %.1f | %.0f | %.2fx | %.2fx |" % (
            name, runs["ppnode"][0][2], p[0], p[1], t[0], t[1], p[0] / t[0], t[1] / p[1])
        if a.baseline:
            row += " %.1f | %.0f |" % med["baseline"]
        print(row + "  <!-- PyTorch best: %s; medians %s -->" % (best, json.dumps({k: [round(x, 1) for x in v] for k, v in med.items()})), flush=True)


if __name__ == "__main__":
    sys.exit(main())
