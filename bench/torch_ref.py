"""PyTorch reference trainer for ppnode's ONNX models: trains what `ppnode train` trains.

    /usr/bin/python3 python/export_models.py gpt /tmp/gpt
    /usr/bin/python3 bench/torch_ref.py --model gpt --init /tmp/gpt/init.safetensors --data fortunes.npz \\
        --steps 200 --batch 16 --micro-batches 4 --optimizer adam --lr 3e-4 --lr-schedule cosine --seed 1
    bin/ppnode train --local --model /tmp/gpt/model.onnx --data fortunes.npz \\
        --steps 200 --batch 16 --micro-batches 4 --optimizer adam --lr 3e-4 --lr-schedule cosine --seed 1

Builds the module python/export_models.py builds (same MODEL and --key=value
options; by default the options export_models.py recorded in --init's
metadata), loads --init (export_models.py's init.safetensors: the ONNX
file's initial weights) with strict=True, and trains it as ppnode does:

- the data: an .npz with x (or x0, x1, ... for several inputs) and y, and
  x_test, y_test (without them the last 10% of the samples are the test
  split). Float32, float64 and uint8 (scaled to [0, 1]) arrays are features,
  signed integer arrays ids (int64 tensors); y holds a label a sample ([N]) or
  a position ([N, T]). With --standardize (ppnode's default) every float
  input is scaled per channel (axis 0 of a [C, H, W] sample, else the last
  axis) by the training split's mean and standard deviation, summed in
  float64 in sample order as data/standardize.go does. Samples must have the
  model's input shape ([H, W, C] data for a [C, H, W] input is transposed).
- the order: global step g is mini-batch g % (N//B) of epoch g // (N//B) in
  ppnode's order (bench/data_order.py: data/loader.go's permutation), cut
  into M micro-batches of consecutive samples, the first B%M one larger.
- a step: each micro-batch its own forward (BatchNorm statistics per
  micro-batch); its loss (--loss: the cross-entropy, or for float targets
  the squared error, or the binary cross-entropy of logits) summed over
  every target (per sample, per position or per value) times
  1/(B·targets a sample) is backpropagated; the gradients add
  up in micro-batch order; one optimizer step.
- the optimizer: torch.optim.SGD (dampening 0, no Nesterov, weight decay
  added to the gradient, the first step's momentum buffer the gradient) or
  torch.optim.Adam (betas 0.9, 0.999, eps 1e-8, L2 weight decay, no AMSGrad,
  bias corrections lr/(1-β1^t) and √(1-β2^t)), as nn/optim.go applies them.
  --ppnode-optim instead replays nn/optim.go's float32 arithmetic operation
  by operation (scalars rounded to float32, 1-β formed in float32, no fused
  multiply-adds), to the bit where PyTorch's kernels round alike.
- the rate of step g (from 0) is nn/schedule.go's: linear warm-up from
  lr/W to lr over W steps, then constant or a cosine decay to 0 at the last
  step; --warmup -1 (the default) is job/spec.go's min(150, steps/5).
- no dropout (the models' default; an option that sets it is warned about).

Prints a JSON line every --log-every steps and a last JSON object with
train_loss (the last step's mean over its labels, as ppnode reports it),
train_accuracy (over all steps), test_loss and test_accuracy (eval mode,
the test split in stored order; perplexity for per-position labels),
samples_per_sec and seconds (the training loop). --out FILE.safetensors
writes the final state_dict. --time-only skips the evaluation. --threads N
sets torch.set_num_threads(N) (and OMP_NUM_THREADS, OPENBLAS_NUM_THREADS
if they are unset); without it torch's default, which honours
OMP_NUM_THREADS, stands. --float64 trains a float64 copy (a reference
without float32 rounding).
"""
import argparse
import json
import math
import os
import sys
import time


def _pre_threads(argv):
    """--threads N, read before torch is imported so that OpenMP and
    OpenBLAS start with N threads unless their variables say otherwise."""
    for i, a in enumerate(argv):
        v = None
        if a.startswith("--threads="):
            v = a.split("=", 1)[1]
        elif a == "--threads" and i + 1 < len(argv):
            v = argv[i + 1]
        if v is not None and v.isdigit() and int(v) > 0:
            os.environ.setdefault("OMP_NUM_THREADS", v)
            os.environ.setdefault("OPENBLAS_NUM_THREADS", v)


_pre_threads(sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import data_order  # noqa: E402
import export_models  # noqa: E402
import ppnode_models as pm  # noqa: E402

HELD_OUT = 0.1  # data/file.go's HeldOut


def parse_bool(v):
    if isinstance(v, bool):
        return v
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("want true or false, got %r" % v)


def lr_at(step, base, warmup, total, kind, floor=0.0):
    """nn/schedule.go's Schedule.At."""
    if step < warmup:
        return base * float(step + 1) / float(warmup)
    span = total - warmup
    if kind == "constant" or span <= 0:
        return base
    t = min(float(step - warmup) / float(span), 1.0)
    f = 0.5 * (1 + math.cos(math.pi * t)) if kind == "cosine" else 1 - t
    return floor + (base - floor) * f


def total_steps(epochs, steps, spe):
    """job/spec.go's TotalSteps."""
    if epochs == 0:
        return steps
    if steps == 0:
        return epochs * spe
    return min(epochs * spe, steps)


# ---------------------------------------------------------------- data


def _features(a, name):
    if a.dtype == np.uint8:
        return a.astype(np.float32) / np.float32(255)
    if a.dtype in (np.float32, np.float64):
        out = a.astype(np.float32)
        if not np.isfinite(out).all():
            raise SystemExit("%s holds NaN or infinite values" % name)
        return out
    raise SystemExit("%s is of type %s: want float32, float64, uint8 or signed integers" % (name, a.dtype))


def load_npz(path):
    """The inputs' train and test arrays (lists), the labels (y, y_test)
    and the input names, as data/file.go reads them."""
    z = np.load(path)
    names = ["x"]
    if "x" not in z.files and "x0" in z.files:
        names = []
        while "x%d" % len(names) in z.files:
            names.append("x%d" % len(names))
    if names[0] not in z.files or "y" not in z.files:
        raise SystemExit("%s: want arrays %s (samples) and y (labels)" % (path, names[0]))

    def conv(n):
        a = z[n]
        return a.astype(np.int64) if a.dtype.kind == "i" else _features(a, n)

    def labels(n):  # float targets stay floats (float32, as ppnode holds them)
        a = z[n]
        return a.astype(np.float32) if a.dtype.kind == "f" else a.astype(np.int64)

    xs, y = [conv(n) for n in names], labels("y")
    if names[0] + "_test" in z.files or "y_test" in z.files:
        xt, yt = [conv(n + "_test") for n in names], labels("y_test")
    else:
        k = int(float(len(y)) * HELD_OUT)
        if k < 1 or len(y) - k < 1:
            raise SystemExit("%s: %d samples, too few to hold out a test split" % (path, len(y)))
        xt, yt = [a[len(y) - k :] for a in xs], y[len(y) - k :]
        xs, y = [a[: len(y) - k] for a in xs], y[: len(y) - k]
    return xs, y, xt, yt, names


def standardize(train, test, axis):
    """data/standardize.go's StandardizeInput on one input: per channel of
    the sample axis `axis`, the mean and (population) standard deviation of
    the training split, summed in float64 in storage order; a zero standard
    deviation is taken as 1. Both splits are rescaled in place."""
    c = train.shape[1 + axis]
    mean, std = np.zeros(c), np.zeros(c)
    for j in range(c):
        v = np.take(train, j, axis=1 + axis).reshape(-1).astype(np.float64)
        n = float(train.size // c)
        mean[j] = np.cumsum(v)[-1] / n  # a sequential sum, as Go's loop
        d = v - mean[j]
        s = math.sqrt(np.cumsum(d * d)[-1] / n)
        std[j] = s if s != 0 else 1.0
    shape = [1] * train.ndim
    shape[1 + axis] = c
    m, s = mean.reshape(shape), std.reshape(shape)
    for a in (train, test):
        a[...] = ((a.astype(np.float64) - m) / s).astype(np.float32)
    return mean, std


# ---------------------------------------------------------------- optimizers


class PpnodeSGD:
    """nn/optim.go's SGD step in torch operations, float32 scalars:
    d = g (+ float32(wd·w)); d = float32(μ·buf) + d after the first step;
    buf = d; w -= float32(lr·d)."""

    def __init__(self, params, lr, momentum, weight_decay, f32):
        self.params, self.lr, self.mu, self.wd = list(params), lr, momentum, weight_decay
        self.r = (lambda v: float(np.float32(v))) if f32 else float
        self.buf, self.steps = {}, 0

    def step(self):
        lr, mu, wd = self.r(self.lr), self.r(self.mu), self.r(self.wd)
        with torch.no_grad():
            for p in self.params:
                d = p.grad
                if wd != 0:
                    d = d + p * wd
                if mu != 0:
                    if self.steps > 0:
                        d = self.buf[id(p)] * mu + d
                    self.buf[id(p)] = d.clone()
                p.sub_(d * lr)
                p.grad.zero_()
        self.steps += 1


class PpnodeAdam:
    """nn/optim.go's Adam step in torch operations, float32 scalars:
    m = float32(m·β1) + float32((1−β1)·d); v = float32(v·β2) +
    float32(float32((1−β2)·d)·d); w -= float32(lr/(1−β1^t) ·
    (m / (√v / √(1−β2^t) + ε)))."""

    def __init__(self, params, lr, weight_decay, f32, beta1=0.9, beta2=0.999, eps=1e-8):
        self.params, self.lr, self.wd = list(params), lr, weight_decay
        self.b1, self.b2, self.eps, self.f32 = beta1, beta2, eps, f32
        self.m = {id(p): torch.zeros_like(p) for p in self.params}
        self.v = {id(p): torch.zeros_like(p) for p in self.params}
        self.steps = 0

    def step(self):
        self.steps += 1
        t = float(self.steps)
        bc1, bc2 = 1 - math.pow(self.b1, t), 1 - math.pow(self.b2, t)
        if self.f32:
            f = np.float32
            b1, b2 = f(self.b1), f(self.b2)
            k = [float(v) for v in (b1, f(1) - b1, b2, f(1) - b2, f(math.sqrt(bc2)), f(self.eps),
                                    f(self.lr / bc1), f(self.wd))]
        else:
            k = [self.b1, 1 - self.b1, self.b2, 1 - self.b2, math.sqrt(bc2), self.eps, self.lr / bc1, self.wd]
        b1, c1, b2, c2, bc2s, eps, step_size, wd = k
        with torch.no_grad():
            for p in self.params:
                d = p.grad
                if wd != 0:
                    d = d + p * wd
                m, v = self.m[id(p)], self.v[id(p)]
                m.mul_(b1).add_(d * c1)
                v.mul_(b2).add_((d * c2) * d)
                denom = v.sqrt() / bc2s + eps
                p.sub_((m / denom) * step_size)
                p.grad.zero_()


class TorchOptim:
    """torch.optim.SGD, Adam or AdamW with ppnode's conventions, the rate
    set before each step."""

    def __init__(self, name, params, lr, momentum, weight_decay):
        if name == "sgd":
            self.opt = torch.optim.SGD(params, lr=lr, momentum=momentum, dampening=0, nesterov=False,
                                       weight_decay=weight_decay, foreach=False)
        elif name == "adamw":
            self.opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
                                         amsgrad=False, foreach=False)
        else:
            self.opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
                                        amsgrad=False, foreach=False)
        self.lr = lr

    def step(self):
        for g in self.opt.param_groups:
            g["lr"] = self.lr
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)


# ---------------------------------------------------------------- training


def forward_loss(model, xs, y, kind="ce", smoothing=0.0, pos_weight="", weight=None):
    """The micro-batch's summed loss over every target, the number of
    targets predicted right and the targets. kind is ppnode's --loss: ce
    (class labels), mse, l1 or huber (float targets of the output's shape) or bce
    (logits against targets in [0, 1], positives weighted by pos_weight if
    given; right when the sign agrees with the target's side of 1/2)."""
    out = model(*xs)
    if kind in ("mse", "l1", "huber"):
        t = y.to(out.dtype).reshape(out.shape)
        f = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss}[kind]
        return f(out, t, reduction="sum"), 0, t.numel()
    if kind == "bce":
        t = y.to(out.dtype).reshape(out.shape)
        correct = int(((out.detach() > 0) == (t > 0.5)).sum())
        pw = torch.tensor([float(w) for w in pos_weight.split(",")], dtype=out.dtype) if pos_weight else None
        return F.binary_cross_entropy_with_logits(out, t, reduction="sum", pos_weight=pw), correct, t.numel()
    if out.dim() > 2 and tuple(out.shape[2:]) == tuple(y.shape[1:]) and out.shape[1] != out.shape[-1]:
        out = out.movedim(1, -1)  # classes on axis 1, a label a position (a segmentation's)
    logits = out.reshape(-1, out.shape[-1])
    labels = y.reshape(-1)
    loss = F.cross_entropy(logits, labels, weight=weight, reduction="sum", label_smoothing=smoothing)  # -100 is ignored
    correct = int((logits.detach().argmax(dim=-1) == labels).sum())
    return loss, correct, int((labels != -100).sum())


def mass(y, weight):
    """What a mean over labels y divides by (ppnode's nn.Loss Mass): the
    labels that count, or their class weights' sum."""
    if weight is None:
        return float((y != -100).sum())
    y = y.reshape(-1)
    return float(weight[y[y != -100]].double().sum())


def evaluate(model, xs, y, batch, kind="ce", smoothing=0.0, pos_weight="", weight=None):
    """Mean loss and accuracy over the labels of a split, in eval mode, in
    stored order."""
    model.eval()
    total, correct, n, m = 0.0, 0, 0, 0.0
    with torch.no_grad():
        for lo in range(0, len(y), batch):
            loss, c, k = forward_loss(model, [x[lo : lo + batch] for x in xs], y[lo : lo + batch], kind, smoothing, pos_weight, weight)
            total += float(loss)
            correct += c
            n += k
            m += mass(y[lo : lo + batch], weight) if weight is not None else k
    model.train()
    if n == 0:
        return float("nan"), float("nan")
    return total / m, correct / n


def auc(model, xs, y, batch):
    """The ROC AUC of the model's outputs (eval mode) against the split's
    0/1 targets, over every value, ties at their mean rank (the
    Mann-Whitney statistic, as scikit-learn's roc_auc_score)."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(*[x[lo : lo + batch] for x in xs]).reshape(-1) for lo in range(0, len(y), batch)])
    model.train()
    s, t = out.double().numpy(), y.reshape(-1).double().numpy()
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[order[j]] == s[order[i]]:
            j += 1
        ranks[order[i:j]] = (i + j + 1) / 2
        i = j
    pos = float((t == 1).sum())
    neg = len(t) - pos
    return float((ranks[t == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                 epilog="Further --key=value options are the model's (python/export_models.py); "
                                        "by default those recorded in --init's metadata.")
    ap.add_argument("--model", required=True, choices=export_models.MODELS)
    ap.add_argument("--init", default="", help="initial weights (export_models.py's init.safetensors)")
    ap.add_argument("--data", required=True, help=".npz with x (or x0, x1, ...), y, optionally x_test, y_test")
    ap.add_argument("--steps", type=int, default=0, help="steps (0: all epochs)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs (default 3; with --steps and without --epochs, as many as the steps need)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    ap.add_argument("--lr", type=float, default=0, help="peak rate (default: 3e-4 for adam, 0.005 for sgd)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0)
    ap.add_argument("--no-decay-1d", action="store_true",
                    help="ppnode's --no-decay-1d: parameter groups without decay for tensors of one axis")
    ap.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"], default="cosine")
    ap.add_argument("--min-lr", type=float, default=0.0, help="ppnode's --min-lr")
    ap.add_argument("--warmup", "--warmup-steps", dest="warmup", type=int, default=-1,
                    help="steps of linear warm-up (-1: min(150, steps/5))")
    ap.add_argument("--seed", type=int, default=1, help="ppnode's seed: the data order")
    ap.add_argument("--standardize", type=parse_bool, nargs="?", const=True, default=True,
                    help="scale float inputs per channel as ppnode does (default true; --standardize=false)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--time-only", action="store_true", help="skip the evaluation (speed comparisons)")
    ap.add_argument("--ppnode-optim", action="store_true", help="replay nn/optim.go's float32 arithmetic")
    ap.add_argument("--float64", action="store_true", help="train in float64")
    ap.add_argument("--label-smoothing", type=float, default=0.0, help="ppnode's --label-smoothing (ce)")
    ap.add_argument("--pos-weight", default="", help="ppnode's --pos-weight (bce's pos_weight): one number, or one a value of the last axis")
    ap.add_argument("--freeze", default="", help="ppnode's --freeze: comma-separated prefixes of parameter names")
    ap.add_argument("--class-weights", default="", help="ppnode's --class-weights (ce's weight=), comma-separated")
    ap.add_argument("--clip-grad-norm", type=float, default=0.0, help="ppnode's --clip-grad-norm (clip_grad_norm_ before each step)")
    ap.add_argument("--loss", choices=["", "ce", "mse", "l1", "huber", "bce"], default="",
                    help="ppnode's --loss (default: ce for integer labels, mse for float targets)")
    ap.add_argument("--log-every", type=int, default=10, help="a JSON line every N steps (0: none)")
    ap.add_argument("--eval-batch", type=int, default=256)
    ap.add_argument("--out", default="", help="write the final state_dict to this safetensors file")
    a, rest = ap.parse_known_args()
    opts = export_models.parse_options(rest)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.lr == 0:
        a.lr = 3e-4 if a.optimizer in ("adam", "adamw") else 0.005
    if a.epochs is None:
        a.epochs = 0 if a.steps > 0 else 3
    tensors = None
    if a.init:
        tensors, meta = pm.read_safetensors(a.init)
        if meta.get("model") not in (None, a.model):
            raise SystemExit("%s holds the initial weights of %s, not %s" % (a.init, meta["model"], a.model))
        if "options" in meta:  # export_models.py's; the command line's win
            opts = dict(json.loads(meta["options"]), **opts)
    torch.manual_seed(a.seed)
    model, specs = export_models.build(a.model, **opts)
    if tensors is not None:
        model.load_state_dict(tensors, strict=True)
    else:
        print("warning: no --init: PyTorch's initial weights, not the ONNX file's", file=sys.stderr)
    if opts.get("dropout", 0):
        print("warning: dropout %g: PyTorch's masks are not ppnode's, the runs will differ" % opts["dropout"],
              file=sys.stderr)
    dtype = torch.float64 if a.float64 else torch.float32
    model = model.to(dtype)
    model.train()

    xs, y, xt, yt, names = load_npz(a.data)
    if len(xs) != len(specs):
        raise SystemExit("the model takes %d inputs (%s); %s has %s" % (
            len(specs), ", ".join(s[0] for s in specs), a.data, ", ".join(names)))
    for k, (name, shape, sdt, high) in enumerate(specs):
        data = tuple(xs[k].shape[1:])
        is_int = xs[k].dtype == np.int64
        if is_int != (sdt == torch.int64):
            raise SystemExit("input %s takes %s; %s holds %s" % (name, "integers" if sdt == torch.int64 else "floats",
                                                                 names[k], "integers" if is_int else "floats"))
        axis = len(data) - 1
        if data != tuple(shape):
            if len(shape) == 3 and data == (shape[1], shape[2], shape[0]):
                xs[k], xt[k] = xs[k].transpose(0, 3, 1, 2).copy(), xt[k].transpose(0, 3, 1, 2).copy()
                axis = 0  # the data's last axis
            else:
                raise SystemExit("input %s takes samples of shape %s; %s's are %s" % (name, list(shape), names[k], list(data)))
        elif len(data) == 3:
            axis = 0
        if is_int and high is not None and (xs[k].min() < 0 or xs[k].max() >= high or xt[k].min() < 0 or xt[k].max() >= high):
            raise SystemExit("%s holds ids outside [0, %d)" % (names[k], high))
        if a.standardize and not is_int:
            standardize(xs[k], xt[k], axis)
    if a.loss == "":
        a.loss = "mse" if y.dtype.kind == "f" else "ce"
    N = len(y)
    spe = data_order.steps_per_epoch(N, a.batch)
    if not 1 <= a.micro_batches <= a.batch <= N:
        raise SystemExit("want 1 <= micro-batches (%d) <= batch (%d) <= samples (%d)" % (a.micro_batches, a.batch, N))
    total = total_steps(a.epochs, a.steps, spe)
    warmup = min(150, total // 5) if a.warmup < 0 else a.warmup
    labels = int(np.prod(y.shape[1:], dtype=np.int64))
    scale = 1.0 / float(a.batch * labels)
    if not a.float64:
        scale = float(np.float32(scale))  # nn.LossScale

    def tensor(arr):
        t = torch.from_numpy(arr)
        return t if arr.dtype == np.int64 else t.to(dtype)

    X, Y = [tensor(x) for x in xs], torch.from_numpy(y)
    weight = torch.tensor([float(w) for w in a.class_weights.split(",")], dtype=dtype) if a.class_weights else None
    ignored = a.loss == "ce" and bool((Y == -100).any())
    XT, YT = [tensor(x) for x in xt], torch.from_numpy(yt)
    frozen = tuple(f for f in a.freeze.split(",") if f)
    for n, p in model.named_parameters():
        if n.startswith(frozen):
            p.requires_grad_(False)  # and out of the optimizer and the norm
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    if a.ppnode_optim and (a.optimizer == "adamw" or a.no_decay_1d):
        raise SystemExit("--ppnode-optim replays sgd and adam, without parameter groups")
    if a.ppnode_optim:
        opt = PpnodeSGD(params, a.lr, a.momentum, a.weight_decay, not a.float64) if a.optimizer == "sgd" else \
            PpnodeAdam(params, a.lr, a.weight_decay, not a.float64)
    else:
        groups = params
        if a.no_decay_1d:  # nanoGPT's configure_optimizers
            groups = [{"params": [p for p in params if p.dim() >= 2]},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        opt = TorchOptim(a.optimizer, groups, a.lr, a.momentum, a.weight_decay)

    print(json.dumps({"model": a.model, "options": opts, "params": sum(p.numel() for p in params), "train": N,
                      "test": len(yt), "steps": total, "steps_per_epoch": spe, "warmup": warmup,
                      "threads": torch.get_num_threads()}), flush=True)
    start = time.time()
    train_loss, correct_all, seen = float("nan"), 0, 0
    for g in range(total):
        lr = lr_at(g, a.lr, warmup, total, a.lr_schedule, a.min_lr)
        opt.lr = lr
        step_loss, step_correct, step_labels, step_mass = 0.0, 0, 0, 0.0
        if ignored or weight is not None:  # the mean over the labels that count (-100 is ignored), or their weights
            idx = np.concatenate([np.array(i, dtype=np.int64) for i in data_order.micro_batches(N, a.seed, a.batch, a.micro_batches, g)])
            scale = 1.0 / mass(Y[torch.from_numpy(idx)], weight)
            if not a.float64:
                scale = float(np.float32(scale))
        for idx in data_order.micro_batches(N, a.seed, a.batch, a.micro_batches, g):
            i = torch.from_numpy(np.array(idx, dtype=np.int64))  # a writable copy
            loss, correct, n = forward_loss(model, [x[i] for x in X], Y[i], a.loss, a.label_smoothing, a.pos_weight, weight)
            (loss * scale).backward()
            step_loss += float(loss)
            step_correct += correct
            step_labels += n
            step_mass += mass(Y[i], weight) if weight is not None else n
        if a.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip_grad_norm)
        opt.step()
        train_loss = step_loss / step_mass
        if not math.isfinite(train_loss):
            raise SystemExit("step %d: the loss is %r" % (g + 1, train_loss))
        correct_all += step_correct
        seen += step_labels
        if a.log_every > 0 and ((g + 1) % a.log_every == 0 or g + 1 == total):
            el = time.time() - start
            print(json.dumps({"step": g + 1, "loss": train_loss, "lr": lr, "samples_per_sec": (g + 1) * a.batch / el}),
                  flush=True)
    seconds = time.time() - start
    res = {"impl": "pytorch", "model": a.model, "options": opts, "data": a.data, "steps": total,
           "epochs": total / spe, "batch": a.batch, "micro_batches": a.micro_batches, "optimizer": a.optimizer,
           "lr": a.lr, "lr_schedule": a.lr_schedule, "warmup": warmup, "seed": a.seed,
           "dtype": "float64" if a.float64 else "float32", "ppnode_optim": a.ppnode_optim,
           "threads": torch.get_num_threads(), "loss": a.loss, "train_loss": train_loss,
           "train_accuracy": correct_all / max(seen, 1), "samples_per_sec": total * a.batch / seconds,
           "seconds": seconds}
    if not a.time_only:
        res["test_loss"], res["test_accuracy"] = evaluate(model, XT, YT, a.eval_batch, a.loss, a.label_smoothing, a.pos_weight, weight)
        if a.loss == "bce":
            res["test_auc"] = auc(model, XT, YT, a.eval_batch)
        if y.ndim > 1 and a.loss == "ce":
            res["perplexity"] = math.exp(res["test_loss"])
    if a.out:
        sd = {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        pm.write_safetensors(a.out, sd, {"format": "pt", "model": a.model, "options": json.dumps(opts, sort_keys=True),
                                         "steps": str(total), "seed": str(a.seed), "trainer": "bench/torch_ref.py"})
        res["out"] = a.out
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
