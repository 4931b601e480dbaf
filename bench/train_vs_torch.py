"""Side-by-side training speed: ppnode against PyTorch on the same model,
batch, micro-batches and thread count, run alternately (A B A B ...) so that
both see the same machine; prints each run and the medians.

Run: /usr/bin/python3 bench/train_vs_torch.py [--rounds 3] [--threads 1,2] [--models mlp32,resnet50]
(after `make build`; it uses bin/ppnode).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {
    # model: (ppnode flags, torch flags, steps)
    "mlp32": (["--model", "mlp32", "--data", "mnist", "--optimizer", "sgd", "--momentum", "0.9"], ["--model", "mlp32"], 60),
    "resnet50": (
        ["--model", "resnet50", "--width", "0.25", "--data", "synthetic:32x32x3:10", "--synthetic-samples", "1024",
         "--optimizer", "sgd", "--momentum", "0.9"],
        ["--model", "resnet50", "--width", "0.25"],
        6,
    ),
}


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def pin(threads):
    """Both implementations run on the same CPUs: taskset to the first N."""
    return ["taskset", "-c", ",".join(str(i) for i in range(threads))]


def run_ppnode(flags, steps, threads, batch, micro):
    cmd = pin(threads) + [os.path.join(ROOT, "bin", "ppnode"), "train", "--local", "--json", "--steps", str(steps),
           "--threads", str(threads), "--batch", str(batch), "--micro-batches", str(micro)] + flags
    return last_json(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["samples_per_sec"]


def run_torch(flags, steps, threads, batch, micro, omp):
    cmd = pin(threads) + ["/usr/bin/python3", os.path.join(HERE, "torch_train.py"), "--steps", str(steps), "--threads", str(omp),
           "--batch", str(batch), "--micro-batches", str(micro)] + flags
    # Debian's PyTorch calls the pthreads build of OpenBLAS, whose thread
    # count torch.set_num_threads does not set: set both. On these CPUs
    # PyTorch is fastest with one OpenMP thread and OpenBLAS on all of them
    # (two of each oversubscribe), so both splits are run and the better
    # one is reported.
    env = dict(os.environ, OMP_NUM_THREADS=str(omp), OPENBLAS_NUM_THREADS=str(threads))
    return last_json(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)["samples_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="mlp32,resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps-scale", type=float, default=1.0)
    a = ap.parse_args()
    print("| model | CPUs | ppnode samples/s (median) | PyTorch samples/s (median, best config) | ratio | runs (ppnode / torch omp=N / torch omp=1) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in a.models.split(","):
        pflags, tflags, steps = CONFIGS[model]
        steps = max(2, int(steps * a.steps_scale))
        for threads in [int(t) for t in a.threads.split(",")]:
            ours, torch_n, torch_1 = [], [], []
            for _ in range(a.rounds):
                ours.append(run_ppnode(pflags, steps, threads, a.batch, a.micro_batches))
                torch_n.append(run_torch(tflags, steps, threads, a.batch, a.micro_batches, threads))
                if threads > 1:
                    torch_1.append(run_torch(tflags, steps, threads, a.batch, a.micro_batches, 1))
            mo = statistics.median(ours)
            mt = max(statistics.median(torch_n), statistics.median(torch_1) if torch_1 else 0)
            fmt = lambda xs: " ".join("%.0f" % v for v in xs) or "-"
            runs = "%s / %s / %s" % (fmt(ours), fmt(torch_n), fmt(torch_1))
            print("| %s | %d | %.1f | %.1f | %.2fx | %s |" % (model, threads, mo, mt, mo / mt, runs), flush=True)


if __name__ == "__main__":
    sys.exit(main())
