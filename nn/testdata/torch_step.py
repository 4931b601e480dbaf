"""Runs ppnode graphs in PyTorch as the reference for gradient parity.

Usage: /usr/bin/python3 torch_step.py IN.safetensors SPEC.json OUT.safetensors [IN SPEC OUT]...

Each triple is one graph (one interpreter for all: importing torch takes
seconds).

SPEC.json describes the graph (nodes in topological order with their kind,
inputs and attributes), the optimizer and the step: micro-batch sizes.
IN.safetensors holds the initial parameters and buffers by ppnode name, the
input "__x" (NHWC) and the labels "__y". Tensors keep ppnode's layout (NHWC
activations, OHWI convolution weights); the script converts at each op, so the
gradients it writes are in ppnode's layout too.

OUT.safetensors holds, after step 1: "loss1", "grad1/<param>", "value1/<name>";
after step 2: "value2/<name>". With "float64": true in SPEC.json the
reference runs in float64 (the results are written as float32).
"""
import json
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "I64": np.int64, "I32": np.int32, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(raw[base + b : base + e], dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def nchw(x):
    return x.permute(0, 3, 1, 2)


def nhwc(x):
    return x.permute(0, 2, 3, 1)


class Graph:
    def __init__(self, spec, tensors):
        self.nodes = spec["nodes"]
        self.input = spec["input"]
        self.output = spec["output"]
        self.params = {}
        self.buffers = {}
        for node in self.nodes:
            for p in node.get("params", []):
                t = torch.tensor(tensors[p])
                t.requires_grad_(True)
                self.params[p] = t
            for p in node.get("buffers", []):
                self.buffers[p] = torch.tensor(tensors[p])

    def forward(self, x, train=True):
        vals = {self.input: x}
        for n in self.nodes:
            a = n["attrs"]
            ins = [vals[i] for i in n["inputs"]]
            name, kind = n["name"], n["kind"]
            P = lambda s: self.params.get(name + "." + s)
            if kind == "linear":
                y = F.linear(ins[0].reshape(ins[0].shape[0], -1), P("weight"), P("bias"))
            elif kind == "relu":
                y = F.relu(ins[0])
            elif kind == "conv2d":
                w = P("weight").permute(0, 3, 1, 2)
                y = nhwc(F.conv2d(nchw(ins[0]), w, P("bias"), stride=a["stride"], padding=a["pad"]))
            elif kind == "maxpool2d":
                y = nhwc(F.max_pool2d(nchw(ins[0]), a["k"], a["stride"], a["pad"]))
            elif kind == "globalavgpool":
                y = ins[0].mean(dim=(1, 2))
            elif kind == "batchnorm":
                c = ins[0].shape[-1]
                flat = ins[0].reshape(-1, c)
                y = F.batch_norm(
                    flat,
                    self.buffers[name + ".running_mean"],
                    self.buffers[name + ".running_var"],
                    P("weight"),
                    P("bias"),
                    training=train,
                    momentum=a["momentum"],
                    eps=a["eps"],
                ).reshape(ins[0].shape)
            elif kind == "flatten":
                y = ins[0].reshape(ins[0].shape[0], -1)
            elif kind == "add":
                y = ins[0]
                for t in ins[1:]:
                    y = y + t
            elif kind == "concat":
                y = torch.cat(ins, dim=-1)
            elif kind == "slice":
                y = ins[0][..., a["from"] : a["to"]]
            else:
                raise SystemExit("unknown layer kind " + kind)
            vals[name] = y
        return vals[self.output]


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    for i in range(0, len(args), 3):
        run(*args[i : i + 3])


def run(inp, spec_path, out_path):
    spec = json.load(open(spec_path))
    tensors = read_safetensors(inp)
    torch.set_default_dtype(torch.float32)
    if spec.get("float64"):
        # The exact reference: ppnode's float32 result is compared with it.
        torch.set_default_dtype(torch.float64)
        tensors = {k: v.astype(np.float64) for k, v in tensors.items()}
    g = Graph(spec, tensors)
    x = torch.tensor(tensors["__x"])
    y = torch.tensor(tensors["__y"]).long()
    o = spec["optimizer"]
    for k in spec.get("frozen") or []:
        g.params[k].requires_grad_(False)  # and left out of the optimizer
    params = [g.params[k] for k in sorted(g.params) if g.params[k].requires_grad]
    if o.get("no_decay_1d"):
        # nanoGPT's parameter groups: no decay for tensors of one axis.
        params = [{"params": [p for p in params if p.dim() >= 2]},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if o["name"] == "sgd":
        opt = torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])
    elif o["name"] == "adamw":
        opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"])
    else:
        opt = torch.optim.Adam(params, lr=o["lr"], weight_decay=o["weight_decay"])
    sizes = spec["micro_sizes"]
    B = sum(sizes)
    out = {}
    for step in (1, 2):
        opt.zero_grad()
        total, lo = 0.0, 0
        for n in sizes:
            logits = g.forward(x[lo : lo + n])
            loss = F.cross_entropy(logits, y[lo : lo + n], reduction="sum") / B
            loss.backward()
            total += loss.item()
            lo += n
        if step == 1:
            out["loss1"] = np.array([total], dtype=np.float32)
            for k, p in g.params.items():
                if p.grad is not None:
                    out["grad1/" + k] = p.grad.detach().numpy().copy()
        opt.step()
        for k, p in list(g.params.items()) + list(g.buffers.items()):
            out["value%d/%s" % (step, k)] = p.detach().numpy().copy()
    write_safetensors(out_path, out)


if __name__ == "__main__":
    main()
