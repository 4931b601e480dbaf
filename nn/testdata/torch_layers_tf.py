"""Runs single ppnode layers (transformer, embedding and broadcasting layers)
in PyTorch, in float64, as the reference for their forward and backward
passes.

Usage: /usr/bin/python3 torch_layers_tf.py < REQUEST.json > RESULT.json

REQUEST.json is {"cases": [CASE, ...]}, each CASE
  {"name": str, "kind": str, "attrs": {...},
   "inputs": [{"shape": [...], "data": [...], "int": bool}, ...],
   "params": [{"shape": [...], "data": [...]}, ...],   # in Params() order
   "dout": {"shape": [...], "data": [...]}}
with batch-first shapes and ppnode's layouts. For each case RESULT.json has
  {"out": [...], "grads": [[...] or null per input], "pgrads": [[...], ...]}
flattened in row-major order: the output, the gradient of sum(out * dout)
with respect to every float input and every parameter.
"""
import json
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def tensor(spec, integer=False):
    t = torch.tensor(spec["data"], dtype=torch.float64).reshape(spec["shape"])
    if integer:
        return t.long()
    return t.requires_grad_(True)


def operand(attrs, params):
    """BroadcastOp's and ParamBroadcast's c, of per-sample shape attrs["shape"]."""
    shape = attrs["shape"]
    if params:
        flat = params[0].reshape(-1)
        if attrs.get("map") is not None:
            flat = flat[torch.tensor(attrs["map"], dtype=torch.long)]
        return flat.reshape(shape)
    return torch.tensor(attrs["const"], dtype=torch.float64).reshape(shape)


def run(case):
    kind, a = case["kind"], case["attrs"]
    ins = [tensor(s, s.get("int", False)) for s in case["inputs"]]
    ps = [tensor(s) for s in case["params"]]
    x = ins[0]
    if kind == "layernorm":
        w, b = (ps[0], ps[1]) if ps else (None, None)
        out = F.layer_norm(x, (x.shape[-1],), w, b, a["eps"])
    elif kind == "embedding":
        out = F.embedding(x, ps[0])
    elif kind == "matmul":
        p, q = ins
        if a["transA"]:
            p = p.transpose(-1, -2)
        if a["transB"]:
            q = q.transpose(-1, -2)
        out = torch.matmul(p, q)
    elif kind == "broadcast":
        p, q = ins
        out = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[a["op"]](p, q)
    elif kind == "broadcastop":
        c = operand(a, ps).unsqueeze(0)
        out = {
            "add": lambda: x + c, "sub": lambda: x - c, "rsub": lambda: c - x,
            "mul": lambda: x * c, "div": lambda: x / c, "rdiv": lambda: c / x,
            "pow": lambda: x ** c,
        }[a["op"]]()
    elif kind == "parambroadcast":
        c = operand(a, ps)
        out = c.unsqueeze(0).expand((x.shape[0],) + tuple(c.shape))
    elif kind == "take":
        out = torch.index_select(x, a["axis"] + 1, torch.tensor(a["index"], dtype=torch.long))
    elif kind == "mask":
        m = torch.tensor(a["mask"], dtype=torch.bool).reshape([1] + a["shape"])
        out = x.masked_fill(m, a["fill"])
    elif kind == "reduce":
        out = (x.sum if a["op"] == "sum" else x.mean)(dim=-1, keepdim=True)
    elif kind == "pad":
        # F.pad takes (before, after) pairs from the last axis backwards.
        pad = [0, 0] * (x.dim() - 2 - a["axis"]) + [a["before"], a["after"]]
        out = F.pad(x, pad, value=a["value"])
    else:
        raise ValueError("unknown kind " + kind)
    dout = torch.tensor(case["dout"]["data"]).reshape(case["dout"]["shape"])
    leaves = [t for t in ins + ps if t.requires_grad]
    grads = torch.autograd.grad((out * dout).sum(), leaves, allow_unused=True) if leaves else []
    g = dict(zip(map(id, leaves), grads))

    def flat(t):
        if t is None:
            return None
        return t.detach().reshape(-1).tolist()

    return {
        "out": flat(out),
        "grads": [flat(g.get(id(t))) if t.requires_grad else None for t in ins],
        "pgrads": [flat(g.get(id(t))) for t in ps],
    }


def main():
    req = json.load(sys.stdin)
    json.dump({c["name"]: run(c) for c in req["cases"]}, sys.stdout)


if __name__ == "__main__":
    main()
