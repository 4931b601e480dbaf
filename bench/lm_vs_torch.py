"""Training speed of an ONNX model, ppnode against PyTorch, alternately.

Default: the GPT of python/ppnode_models.py (4 blocks, d=256, 4 heads,
context 128, byte vocabulary) on the fortunes text (bench/text_data.py),
batch 16 sequences, with SGD (momentum 0.9) and Adam. Each round runs
ppnode (`train --local`), then PyTorch (bench/torch_ref.py --time-only) in
each thread configuration given; prints every run and the medians of
samples/s. Both start from the same weights (export_models.py writes the
ONNX file and init.safetensors) and visit the same samples.

Run:
  /usr/bin/python3 bench/text_data.py --out /tmp/fortunes.npz
  /usr/bin/python3 python/export_models.py gpt /tmp/gpt --seed 1
  /usr/bin/python3 bench/lm_vs_torch.py --ppnode /tmp/ppnode --model gpt --dir /tmp/gpt --data /tmp/fortunes.npz
(ppnode built with `make build` or `go build -tags 'openblas dnnl'`).
--torch lists PyTorch's configurations as torch-threads:blas-threads;
--ppnode may list several binaries (comma-separated), each run in turn.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def last_json(out):
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON in output:\n" + out[-2000:])


def small_test(data, keep=32):
    """A copy of data with its test split cut to keep samples: ppnode
    evaluates the test split after training, which is not timed but takes
    as long as minutes of training."""
    import numpy as np

    d = dict(np.load(data))
    for k in list(d):
        if k.endswith("_test"):
            d[k] = d[k][:keep]
    f = tempfile.NamedTemporaryFile(suffix=".npz", delete=False)
    np.savez(f.name, **d)
    return f.name


def run_ppnode(a, binary, data, opt):
    cmd = [binary, "train", "--local", "--model", os.path.join(a.dir, "model.onnx"), "--data", data,
           "--steps", str(a.steps), "--batch", str(a.batch), "--micro-batches", str(a.micro), "--optimizer", opt,
           "--threads", str(a.threads), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return last_json(out)["samples_per_sec"]


def run_torch(a, data, opt, cfg):
    tt, bt = cfg.split(":")
    env = dict(os.environ, OMP_NUM_THREADS=bt, OPENBLAS_NUM_THREADS=bt)
    cmd = [sys.executable, os.path.join(HERE, "torch_ref.py"), "--model", a.model, "--init", os.path.join(a.dir, "init.safetensors"),
           "--data", data, "--steps", str(a.steps), "--batch", str(a.batch), "--micro-batches", str(a.micro),
           "--optimizer", opt, "--threads", tt, "--time-only"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return last_json(out)["samples_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ppnode", default="/tmp/ppnode")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--dir", required=True, help="export_models.py's output: model.onnx and init.safetensors")
    ap.add_argument("--data", required=True)
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="ppnode's threads")
    ap.add_argument("--torch", default="1:2,2:2", help="PyTorch configurations torch:blas threads")
    a = ap.parse_args()
    data = small_test(a.data)
    try:
        for opt in a.optimizers.split(","):
            binaries = a.ppnode.split(",")
            runs = {f"ppnode {b}" if len(binaries) > 1 else "ppnode": [] for b in binaries}
            for cfg in a.torch.split(","):
                runs["torch " + cfg] = []
            for r in range(a.rounds):
                print(f"{opt} round {r + 1}:", end="", flush=True)
                for b, key in zip(binaries, runs):
                    v = run_ppnode(a, b, data, opt)
                    runs[key].append(v)
                    print(f" {key} {v:.1f},", end="", flush=True)
                for cfg in a.torch.split(","):
                    v = run_torch(a, data, opt, cfg)
                    runs["torch " + cfg].append(v)
                    print(f" torch {cfg} {v:.1f}", end="", flush=True)
                print(" samples/s")
            med = {k: statistics.median(v) for k, v in runs.items()}
            best = max(v for k, v in med.items() if k.startswith("torch"))
            print(f"{opt} medians: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) + "; over the best PyTorch: " +
                  ", ".join(f"{k} {v / best:.2f}x" for k, v in med.items() if k.startswith("ppnode")))
    finally:
        os.unlink(data)


if __name__ == "__main__":
    main()
