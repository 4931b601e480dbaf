"""Builds one of ppnode's ONNX test models in PyTorch and exports it.

Usage: /usr/bin/python3 python/export_models.py MODEL OUTDIR [--seed S] [--key=value ...]

MODEL is gpt, dlrm, twotower, transformer, vit, lstm, gru, mobilenetv2,
autoencoder, misc, or for the losses other than the cross-entropy regress
(ppnode's --loss mse), denoise (mse against clean images), ctr (DLRM with
one logit, --loss bce) or segment (a U-Net, a class a pixel); --key=value sets a constructor argument of the model
(python/ppnode_models.py), for example --d=128 --blocks=2 for gpt or
--bottom=64,16 for dlrm. Writes OUTDIR/model.onnx (export_onnx: training
mode, no constant folding, opset 13, batch axis dynamic, "ppnode.buffers"
metadata) and OUTDIR/init.safetensors, the state_dict as exported (taken
after the export, which runs the model once in training mode), so that
bench/torch_ref.py starts PyTorch from exactly the ONNX file's weights.
Prints the inputs' names, dtypes and shapes and the output's shape.

The model is built after torch.manual_seed(S) (default 1). Every model's
dropout defaults to 0 (torchvision's mobilenet_v2 included, whose own
default is 0.2): with dropout, ppnode and PyTorch draw different masks.
"""
import argparse
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ppnode_models as pm  # noqa: E402

MODELS = ["gpt", "dlrm", "twotower", "transformer", "vit", "lstm", "gru", "mobilenetv2", "autoencoder", "misc",
          "regress", "denoise", "ctr", "segment"]


def parse_value(v):
    """An option's value: an int, a float, a tuple of ints (1,2 or 1,2,3)
    or a string."""
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    if "," in v:
        return tuple(parse_value(p) for p in v.split(",") if p != "")
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def parse_options(args):
    """Turns ["--key=value", ...] into {key: value}."""
    opts = {}
    for a in args:
        if not a.startswith("--") or "=" not in a:
            raise SystemExit("model options are --key=value, got %r" % a)
        k, v = a[2:].split("=", 1)
        opts[k.replace("-", "_")] = parse_value(v)
    return opts


def _args(fn, opts, skip=()):
    """fn's defaults updated with opts (which must be fn's arguments)."""
    params = inspect.signature(fn).parameters
    bad = [k for k in opts if k not in params or k in skip]
    if bad:
        names = ", ".join(k for k in params if k not in skip)
        raise SystemExit("unknown option(s) %s (the model takes %s)" % (", ".join(bad), names))
    a = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty and k not in skip}
    a.update(opts)
    return a


def build(name, **opts):
    """Returns (model, inputs) for a model name and its options. inputs
    lists, per model input, (name, per-sample shape, dtype, high): high is
    the bound of an integer input's ids (None for a float input)."""
    f32, i64 = torch.float32, torch.int64
    if name == "gpt":
        a = _args(pm.GPT, opts)
        return pm.GPT(**a), [("x", (a["ctx"],), i64, a["vocab"])]
    if name == "dlrm":
        a = _args(pm.DLRM, opts)
        return pm.DLRM(**a), [("x0", (a["dense"],), f32, None), ("x1", (a["tables"],), i64, a["rows"])]
    if name == "twotower":
        a = _args(pm.TwoTower, opts)
        img = (a["channels"], a["image"], a["image"])
        return pm.TwoTower(**a), [("x0", img, f32, None), ("x1", (a["text"],), i64, a["vocab"])]
    if name == "transformer":
        a = _args(pm.TransformerClassifier, opts)
        return pm.TransformerClassifier(**a), [("x", (a["T"],), i64, a["vocab"])]
    if name == "vit":
        a = _args(pm.ViT, opts)
        return pm.ViT(**a), [("x", (a["channels"], a["image"], a["image"]), f32, None)]
    if name in ("lstm", "gru"):
        a = _args(pm.RNNClassifier, opts, skip=("kind",))
        return pm.RNNClassifier(kind=name, **a), [("x", (a["T"], a["features"]), f32, None)]
    if name == "mobilenetv2":
        import torchvision

        a = {"width_mult": 0.25, "num_classes": 10, "dropout": 0.0, "image": 32}
        bad = [k for k in opts if k not in a]
        if bad:
            raise SystemExit("unknown option(s) %s (mobilenetv2 takes %s)" % (", ".join(bad), ", ".join(a)))
        a.update(opts)
        image = a.pop("image")
        return torchvision.models.mobilenet_v2(**a), [("x", (3, image, image), f32, None)]
    if name == "autoencoder":
        a = _args(pm.AutoencoderClassifier, opts)
        return pm.AutoencoderClassifier(**a), [("x", (a["channels"], a["image"], a["image"]), f32, None)]
    if name == "regress":  # --loss mse
        a = _args(pm.Regressor, opts)
        return pm.Regressor(**a), [("x", (a["features"],), f32, None)]
    if name == "denoise":  # --loss mse against clean images
        a = _args(pm.DenoisingAutoencoder, opts)
        return pm.DenoisingAutoencoder(**a), [("x", (a["channels"], a["image"], a["image"]), f32, None)]
    if name == "ctr":  # DLRM with one logit, --loss bce against clicks
        a = _args(pm.DLRM, opts)
        a["top"] = tuple(a["top"][:-1]) + (1,)
        return pm.DLRM(**a), [("x0", (a["dense"],), f32, None), ("x1", (a["tables"],), i64, a["rows"])]
    if name == "segment":  # a class a pixel, the classes on axis 1
        a = _args(pm.UNet, opts)
        return pm.UNet(**a), [("x", (a["channels"], a["image"], a["image"]), f32, None)]
    if name == "misc":
        a = _args(pm.Misc, opts)
        return pm.Misc(**a), [("x", (a["channels"], a["image"], a["image"]), f32, None)]
    raise SystemExit("unknown model %r (want one of %s)" % (name, ", ".join(MODELS)))


def example(inputs, batch=2, generator=None):
    """A batch of random inputs of the given specs."""
    out = []
    for _, shape, dtype, high in inputs:
        if dtype == torch.int64:
            out.append(torch.randint(0, high, (batch,) + tuple(shape), generator=generator))
        else:
            out.append(torch.randn((batch,) + tuple(shape), generator=generator))
    return tuple(out)


def describe(inputs):
    dt = {torch.float32: "float32", torch.int64: "int64"}
    return ", ".join("%s %s [N, %s]" % (n, dt[d], ", ".join(map(str, s))) for n, s, d, _ in inputs)


def check_initializers(path, model):
    """Compares the ONNX file's initializers with the state_dict (same
    names, same values) and checks the file; returns a list of problems.
    Without the onnx package it returns []."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        return []
    m = onnx.load(path)
    onnx.checker.check_model(m)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    problems = []
    for names in pm.tied_names(model):  # a tied tensor is one initializer
        inits.update({n: inits[k] for k in names if k in inits for n in names})
    for n, t in model.state_dict().items():
        if n not in inits:
            if n.endswith("num_batches_tracked"):
                continue  # not used by the graph
            problems.append("state_dict entry %s is not an initializer" % n)
        elif tuple(inits[n].shape) != tuple(t.shape) or not (inits[n] == t.detach().numpy()).all():
            problems.append("initializer %s differs from the state_dict" % n)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=1)
    a, rest = ap.parse_known_args()
    opts = parse_options(rest)
    torch.manual_seed(a.seed)
    model, inputs = build(a.model, **opts)
    os.makedirs(a.outdir, exist_ok=True)
    xs = example(inputs, generator=torch.Generator().manual_seed(a.seed))
    model.eval()
    with torch.no_grad():
        out_shape = list(model(*xs).shape)
    model.train()
    path = os.path.join(a.outdir, "model.onnx")
    pm.export_onnx(model, xs, path, [n for n, _, _, _ in inputs])
    sd = model.state_dict()
    meta = {"model": a.model, "options": json.dumps(opts, sort_keys=True), "seed": str(a.seed),
            "inputs": json.dumps([[n, list(s), str(d).replace("torch.", "")] for n, s, d, _ in inputs])}
    pm.write_safetensors(os.path.join(a.outdir, "init.safetensors"), sd, meta)
    for p in check_initializers(path, model):
        print("warning: " + p, file=sys.stderr)
    params = sum(p.numel() for p in model.parameters())
    print("%s: %d parameters; inputs %s; output logits [N, %s]" % (a.model, params, describe(inputs),
                                                                  ", ".join(map(str, out_shape[1:]))))
    print("wrote %s and %s" % (path, os.path.join(a.outdir, "init.safetensors")))


if __name__ == "__main__":
    main()
