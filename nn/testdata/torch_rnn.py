"""Runs PyTorch's nn.LSTM, nn.GRU and nn.RNN (one layer, one direction,
batch_first=True) in float64, as the reference for ppnode's LSTM and GRU
layers (rnn_test.go), and its RNN (tanh).

Usage: /usr/bin/python3 torch_rnn.py < REQUEST.json > RESULT.json

REQUEST.json is {"cases": [CASE, ...]}, each CASE
  {"name": str, "kind": "lstm" | "gru" | "rnn", "in": int, "hidden": int,
   "x": {"shape": [N, T, in], "data": [...]},
   "params": {"weight_ih": SPEC, "weight_hh": SPEC,
              "bias_ih": SPEC, "bias_hh": SPEC},
   "dout": {"shape": [N, T, hidden], "data": [...]}}
where the params are the module's state_dict tensors (without the "_l0"
suffix). RESULT.json maps each case's name to
  {"out": [...], "dx": [...], "grads": {"weight_ih": [...], ...}}
flattened in row-major order: the output y and the gradients of
sum(y * dout) with respect to x and every parameter.
"""
import json
import sys

import torch

torch.set_default_dtype(torch.float64)

NAMES = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]


def tensor(spec):
    return torch.tensor(spec["data"], dtype=torch.float64).reshape(spec["shape"])


def run(case):
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[case["kind"]]
    m = cls(case["in"], case["hidden"], num_layers=1, batch_first=True).double()
    with torch.no_grad():
        for name in NAMES:
            p = getattr(m, name + "_l0")
            v = tensor(case["params"][name])
            if tuple(p.shape) != tuple(v.shape):
                raise ValueError(f"{case['name']}: {name} of shape {list(v.shape)}, PyTorch's is {list(p.shape)}")
            p.copy_(v)
    x = tensor(case["x"]).requires_grad_(True)
    y, _ = m(x)
    (y * tensor(case["dout"])).sum().backward()
    return {
        "out": y.detach().reshape(-1).tolist(),
        "dx": x.grad.reshape(-1).tolist(),
        "grads": {name: getattr(m, name + "_l0").grad.reshape(-1).tolist() for name in NAMES},
    }


def main():
    req = json.load(sys.stdin)
    json.dump({c["name"]: run(c) for c in req["cases"]}, sys.stdout)


if __name__ == "__main__":
    main()
