"""PyTorch reference for spatial_test.go: transposed convolutions, resizes,
clips and unary operations, in float64.

Usage: /usr/bin/python3 torch_spatial.py IN.safetensors SPEC.json OUT.safetensors

SPEC.json is a list of cases; case i reads "i/x" (NHWC), "i/dy" (the output
gradient, NHWC) and, for a transposed convolution, "i/w" in PyTorch's layout
[In, Out/groups, KH, KW] and "i/b". It writes "i/y" and "i/dx" (NHWC), the
gradients of sum(y*dy), and for a transposed convolution "i/dw" (PyTorch's
layout), "i/db" and, where ConvTranspose2d's own padding can express the
geometry, its output "i/y2".
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import read_safetensors, write_safetensors  # noqa: E402

F64 = torch.float64

UNARY = {
    "sqrt": torch.sqrt,
    "exp": torch.exp,
    "log": torch.log,
    "neg": torch.neg,
    "abs": torch.abs,
    "reciprocal": torch.reciprocal,
    "sin": torch.sin,
    "cos": torch.cos,
    "softplus": F.softplus,
    "silu": F.silu,
    "sign": torch.sign,
}


def nchw(a, grad=False):
    return torch.tensor(a.transpose(0, 3, 1, 2), dtype=F64, requires_grad=grad)


def nhwc(t):
    return t.detach().numpy().transpose(0, 2, 3, 1)


def conv_transpose(c, t, p, x, out):
    w = torch.tensor(t[p + "w"], dtype=F64, requires_grad=True)
    b = torch.tensor(t[p + "b"], dtype=F64, requires_grad=True) if c["bias"] else None
    pt, pl, pb, pr = c["pads"]
    oph, opw = c["outpad"]
    s, d, g = tuple(c["stride"]), tuple(c["dilation"]), c["groups"]
    # The full transposed convolution, then the pads cropped and the output
    # padding added as zeros: any pads, any output padding.
    full = F.conv_transpose2d(x, w, None, stride=s, padding=0, output_padding=0, groups=g, dilation=d)
    y = F.pad(full, (-pl, -pr + opw, -pt, -pb + oph))
    if b is not None:
        y = y + b.view(1, -1, 1, 1)
    if pt == pb and pl == pr and oph < max(s[0], d[0]) and opw < max(s[1], d[1]):
        y2 = F.conv_transpose2d(x, w, b, stride=s, padding=(pt, pl), output_padding=(oph, opw), groups=g, dilation=d)
        out[p + "y2"] = nhwc(y2)
    return y, w, b


def main():
    t = read_safetensors(sys.argv[1])
    with open(sys.argv[2]) as f:
        specs = json.load(f)
    out = {}
    for i, c in enumerate(specs):
        p = "%d/" % i
        x = nchw(t[p + "x"], grad=True)
        w = b = None
        kind = c["kind"]
        if kind == "convtranspose2d":
            y, w, b = conv_transpose(c, t, p, x, out)
        elif kind == "resize":
            mode = "nearest" if c["mode"] == "nearest" else "bilinear"
            ac = c["align_corners"] if mode == "bilinear" else None
            if c.get("scale"):
                y = F.interpolate(x, scale_factor=tuple(float(v) for v in c["scale"]), mode=mode, align_corners=ac)
            else:
                y = F.interpolate(x, size=tuple(c["size"]), mode=mode, align_corners=ac)
            assert list(y.shape[2:]) == c["size"], (y.shape, c["size"])
        elif kind == "clip":
            lo = float("-inf") if c["min"] is None else c["min"]
            hi = float("inf") if c["max"] is None else c["max"]
            y = F.hardtanh(x, lo, hi)
        elif kind == "unary":
            y = UNARY[c["op"]](x)
        elif kind == "hardsigmoid":
            if abs(c["alpha"] - 1 / 6) < 1e-7 and c["beta"] == 0.5:
                y = F.hardsigmoid(x)  # PyTorch's own
            else:
                y = torch.clamp(c["alpha"] * x + c["beta"], 0, 1)
        elif kind == "hardswish":
            y = F.hardswish(x)
        elif kind == "elu":
            alpha = float(torch.tensor(c["alpha"], dtype=torch.float32))
            if c["celu"]:
                y = F.celu(x, alpha)
            elif abs(c["gamma"] - 1) > 1e-6:
                y = F.selu(x)
            else:
                y = F.elu(x, alpha)
        else:
            raise ValueError("unknown kind %r" % kind)
        y.backward(nchw(t[p + "dy"]))
        out[p + "y"] = nhwc(y)
        out[p + "dx"] = nhwc(x.grad)
        if w is not None:
            out[p + "dw"] = w.grad.numpy()
        if b is not None:
            out[p + "db"] = b.grad.numpy()
    write_safetensors(sys.argv[3], out)


if __name__ == "__main__":
    main()
