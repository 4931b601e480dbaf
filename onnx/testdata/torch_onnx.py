"""Exports a PyTorch model to ONNX and trains it, the reference for ppnode's import.

Usage: /usr/bin/python3 torch_onnx.py MODEL OUTDIR [--data N]
       /usr/bin/python3 torch_onnx.py --each DIR N MODEL... (DIR/MODEL/ for each)

MODEL is mlp, resnet, towers, convnet, or one of the families of
python/ppnode_models.py at small sizes: gpt, llama, dlrm, twotower, transformer, padmask, maskpos, einsum, textcnn,
vit, lstm, gru, bilstm, bigru, mobilenet, mobilenetv3, swin, autoencoder, normact, misc, or
torchvision's classifiers at 32x32 (tv_efficientnet, tv_convnext, tv_regnet,
tv_shufflenet, tv_densenet, tv_googlenet, tv_squeezenet, tv_resnext, tv_mnasnet,
tv_vit; dropout off; compared on the first step of one micro-batch). Writes OUTDIR/model.onnx (exported as
a user would: training mode, no constant folding, opset 13) and
OUTDIR/ref.safetensors with the data ("__x" [steps, batch, ...], "__y") and,
from float64 runs of the same float32 initial weights: "loss1" and
"grad1/<name>" of the first step, "value20/<name>" after 20 steps of SGD
(momentum 0.9) and "__nbt" (BatchNorm's num_batches_tracked). Models
of several inputs write "__x0", "__x1", ...; integer inputs are ids
written as floats. Names and
layouts are the state_dict's. Micro-batches are MICRO below, each its own
forward (BatchNorm statistics per micro-batch), the loss summed over the
mini-batch and divided by its size.
"""
import json
import struct
import sys

import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS, BATCH, MICRO, CLASSES = 20, 12, [5, 4, 3], 5
LR, MOMENTUM = 0.05, 0.9


class MLP(nn.Module):
    shape = (2, 10)

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(20, 32), nn.Linear(32, 32)
        self.fc3, self.fc4 = nn.Linear(32, 16), nn.Linear(16, CLASSES)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        x = F.leaky_relu(self.fc3(x), 0.1)
        return self.fc4(torch.sigmoid(x) - 0.5)


class Bottleneck(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.downsample = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.downsample(x))


class ResNet(nn.Module):
    shape = (3, 8, 8)

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(Bottleneck(8, 4, 1))
        self.layer2 = nn.Sequential(Bottleneck(16, 8, 2))
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class Towers(nn.Module):
    shape = (24,)

    def __init__(self):
        super().__init__()
        self.a1, self.a2 = nn.Linear(12, 16), nn.Linear(16, 8)
        self.b1, self.b2 = nn.Linear(12, 16), nn.Linear(16, 8)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        a = self.a2(torch.tanh(self.a1(x[:, :12])))
        b = self.b2(F.relu(self.b1(x[:, 12:] * 2.0)))
        h = F.relu(self.norm(torch.cat([a, b], 1)))
        return F.log_softmax(self.head(h), 1)


class ConvNet(nn.Module):
    shape = (4, 9, 7)

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, (3, 2), (2, 1), (1, 0), dilation=(1, 2), groups=2)
        self.conv2 = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
        self.pool = nn.AvgPool2d(2, 2, 1)
        self.fc = nn.Linear(8 * 3 * 3, CLASSES)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = self.pool(F.relu(self.conv2(x)) + x)
        return self.fc(x.view(x.size(0), -1))


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


def step(model, x, y):
    """One mini-batch: forward and backward of each micro-batch."""
    total, lo = 0.0, 0
    for n in MICRO:
        out = model(x[lo : lo + n])
        loss = F.cross_entropy(out, y[lo : lo + n], reduction="sum") / BATCH
        loss.backward()
        total += loss.item()
        lo += n
    return total


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ppnode_models as pm  # noqa: E402


class _TV:
    def __getattr__(self, name):
        fn = getattr(__import__("torchvision").models, name)

        def build(*a, **k):
            m = fn(*a, **k)
            for mod in m.modules():
                if isinstance(mod, nn.Dropout):
                    mod.p = 0.0
            return m
        return build


def TV():
    return _TV()


def families():
    """The new families at test sizes: a constructor, the inputs (name,
    per-sample shape, None for floats or the ids' bound) and the label
    shape per sample."""
    return {
        "gpt": (lambda: pm.GPT(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2), [("x", (6,), CLASSES)], (6,)),
        # Padded sequences: the labels of the padding are -100, ignored (the
        # mean over the rest, as PyTorch's ignore_index).
        "padlm": (lambda: pm.GPT(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2), [("x", (6,), CLASSES)], (6,)),
        # The cross-entropy with label smoothing 0.1 (FAMILY_SMOOTHING), some
        # labels ignored too.
        "smooth": (lambda: pm.GPT(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2), [("x", (6,), CLASSES)], (6,)),
        # Weights read by several layers: GPT-2's head tied to the token
        # embedding, one block applied three times, one encoder for two inputs.
        "tiedgpt": (lambda: pm.GPT(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2, tie=True), [("x", (6,), CLASSES)], (6,)),
        "clipgpt": (lambda: pm.GPT(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2, tie=True), [("x", (6,), CLASSES)], (6,)),
        "albert": (lambda: pm.Albert(vocab=11, T=6, d=8, heads=2, depth=3, classes=CLASSES), [("x", (6,), 11)], ()),
        "siamese": (lambda: pm.Siamese(features=6, hidden=8, d=4, classes=CLASSES), [("x0", (6,), None), ("x1", (6,), None)], ()),
        # nn.TransformerDecoderLayer: cross-attention's query and key-value
        # projections are two slices of one in_proj_weight.
        "seq2seq": (lambda: pm.Seq2Seq(vocab=CLASSES, S=7, ctx=8, d=8, heads=2, layers=2), [("x0", (7,), CLASSES), ("x1", (6,), CLASSES)], (6,)),
        # PyTorch's nn.Transformer tutorial: the causal mask made in forward
        # (torch.triu, Trilu at opset 14).
        "tutorial": (lambda: pm.TutorialLM(vocab=CLASSES, ctx=8, d=8, heads=2, hidden=16, layers=2), [("x", (6,), CLASSES)], (6,)),
        # One token of each sequence picked by an index from the ids
        # (x[torch.arange(N), i]): before the first padding, the largest id.
        "lasttoken": (lambda: pm.TokenPooled(vocab=11, T=6, d=8, heads=2, classes=CLASSES, pool="last"), [("x", (6,), 11)], ()),
        "eot": (lambda: pm.TokenPooled(vocab=11, T=6, d=8, heads=2, classes=CLASSES, pool="eot"), [("x", (6,), 11)], ()),
        # T5's relative position bias: buckets from torch.arange and log in
        # forward (the log of 0 cast to an integer, discarded by where).
        "t5bias": (lambda: pm.T5Attention(vocab=11, d=8, heads=2, buckets=8, max_distance=16, classes=CLASSES), [("x", (6,), 11)], ()),
        "attnvariants": (lambda: pm.AttentionVariants(vocab=11, d=8, heads=2, classes=CLASSES), [("x", (6,), 11)], ()),
        "padmodes": (lambda: pm.PadModes(channels=2, image=6, width=3, classes=CLASSES), [("x", (2, 6, 6), None)], ()),
        # Loops over cells from a zero state: the zero state's product folds,
        # every step's copy of the cell's weights is tied.
        "lstmcell": (lambda: pm.CellLoop("lstm", features=3, hidden=6, classes=CLASSES), [("x", (5, 3), None)], ()),
        "grucell": (lambda: pm.CellLoop("gru", features=3, hidden=6, classes=CLASSES), [("x", (5, 3), None)], ()),
        "rnn": (lambda: pm.RNNClassifier("rnn", T=5, features=3, hidden=6, layers=2, classes=CLASSES, bidirectional=True),
                [("x", (5, 3), None)], ()),
        "rnnrelu": (lambda: pm.RNNClassifier("rnnrelu", T=5, features=3, hidden=6, classes=CLASSES, head="state"), [("x", (5, 3), None)], ()),
        "llama": (lambda: pm.Llama(vocab=CLASSES, ctx=8, d=16, heads=2, blocks=2), [("x", (6,), CLASSES)], (6,)),
        "dlrm": (lambda: pm.DLRM(dense=5, tables=3, rows=7, dim=4, bottom=(8, 4), top=(8, CLASSES)),
                 [("x0", (5,), None), ("x1", (3,), 7)], ()),
        "twotower": (lambda: pm.TwoTower(channels=2, image=8, patch=4, vocab=11, text=5, d=8, heads=2, blocks=1, hidden=8, classes=CLASSES),
                     [("x0", (2, 8, 8), None), ("x1", (5,), 11)], ()),
        "transformer": (lambda: pm.TransformerClassifier(vocab=11, T=6, d=8, heads=2, layers=2, classes=CLASSES), [("x", (6,), 11)], ()),
        # Token 0 is padding: a mask computed from the ids (Equal, Expand,
        # Where with a condition from the data) and a masked mean.
        "padmask": (lambda: pm.TransformerClassifier(vocab=4, T=6, d=8, heads=2, layers=2, classes=CLASSES, pad=0), [("x", (6,), 4)], ()),
        # Token 0's row of the embedding kept out of training (nn.Embedding's
        # padding_idx, FAMILY_PADDING); no mask hides the token, so without
        # it the row would train.
        "paddingidx": (lambda: pm.TransformerClassifier(vocab=4, T=6, d=8, heads=2, layers=2, classes=CLASSES, padding_idx=0),
                       [("x", (6,), 4)], ()),
        # Positions counted over the tokens (CumSum of the mask, integer arithmetic).
        "maskpos": (lambda: pm.TransformerClassifier(vocab=4, T=6, d=8, heads=2, layers=1, classes=CLASSES, pad=0, positions="mask"),
                    [("x", (6,), 4)], ()),
        "einsum": (lambda: pm.EinsumAttention(vocab=11, T=6, d=8, heads=2, classes=CLASSES), [("x", (6,), 11)], ()),
        "textcnn": (lambda: pm.TextCNN(vocab=11, T=8, d=6, width=4, classes=CLASSES), [("x", (8,), 11)], ()),
        "vit": (lambda: pm.ViT(channels=2, image=8, patch=4, d=8, heads=2, blocks=2, classes=CLASSES), [("x", (2, 8, 8), None)], ()),
        "lstm": (lambda: pm.RNNClassifier("lstm", T=5, features=3, hidden=6, classes=CLASSES), [("x", (5, 3), None)], ()),
        "gru": (lambda: pm.RNNClassifier("gru", T=5, features=3, hidden=6, classes=CLASSES), [("x", (5, 3), None)], ()),
        "bilstm": (lambda: pm.RNNClassifier("lstm", T=5, features=3, hidden=6, layers=2, classes=CLASSES, bidirectional=True),
                   [("x", (5, 3), None)], ()),
        "bigru": (lambda: pm.RNNClassifier("gru", T=5, features=3, hidden=6, classes=CLASSES, bidirectional=True, head="state"),
                  [("x", (5, 3), None)], ()),
        "mobilenet": (lambda: __import__("torchvision").models.mobilenet_v2(width_mult=0.25, num_classes=CLASSES, dropout=0.0),
                      [("x", (3, 64, 64), None)], ()),
        # Hardswish, and Hardsigmoid in its squeeze-and-excitation blocks.
        "mobilenetv3": (lambda: __import__("torchvision").models.mobilenet_v3_small(width_mult=0.25, num_classes=CLASSES, dropout=0.0),
                        [("x", (3, 64, 64), None)], ()),
        # Shifted windows: torch.roll, an attention mask written by slice
        # assignment (ScatterND), a relative position bias gathered by a buffer.
        "swin": (lambda: __import__("torchvision").models.swin_transformer.SwinTransformer(
            patch_size=[2, 2], embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=[2, 2],
            stochastic_depth_prob=0.0, num_classes=CLASSES), [("x", (3, 8, 8), None)], ()),
        "tv_efficientnet": (lambda: TV().efficientnet_b0(num_classes=CLASSES, stochastic_depth_prob=0.0), [("x", (3, 32, 32), None)], ()),
        "tv_convnext": (lambda: TV().convnext_tiny(num_classes=CLASSES, stochastic_depth_prob=0.0), [("x", (3, 32, 32), None)], ()),
        "tv_regnet": (lambda: TV().regnet_y_400mf(num_classes=CLASSES), [("x", (3, 32, 32), None)], ()),
        "tv_shufflenet": (lambda: TV().shufflenet_v2_x0_5(num_classes=CLASSES), [("x", (3, 32, 32), None)], ()),
        "tv_densenet": (lambda: TV().densenet121(num_classes=CLASSES), [("x", (3, 32, 32), None)], ()),
        "tv_googlenet": (lambda: TV().googlenet(num_classes=CLASSES, aux_logits=False, init_weights=True), [("x", (3, 32, 32), None)], ()),
        "tv_squeezenet": (lambda: TV().squeezenet1_1(num_classes=CLASSES), [("x", (3, 48, 48), None)], ()),
        "tv_resnext": (lambda: TV().resnext50_32x4d(num_classes=CLASSES), [("x", (3, 32, 32), None)], ()),
        "tv_mnasnet": (lambda: TV().mnasnet0_5(num_classes=CLASSES), [("x", (3, 32, 32), None)], ()),
        "tv_vit": (lambda: TV().vit_b_16(num_classes=CLASSES, image_size=32), [("x", (3, 32, 32), None)], ()),
        "autoencoder": (lambda: pm.AutoencoderClassifier(channels=2, image=16, width=4, classes=CLASSES), [("x", (2, 16, 16), None)], ()),
        "normact": (lambda: pm.NormAct(channels=2, image=4, width=4, classes=CLASSES), [("x", (2, 4, 4), None)], ()),
        "misc": (lambda: pm.Misc(channels=2, image=6, width=3, classes=CLASSES), [("x", (2, 6, 6), None)], ()),
        # Losses other than the cross-entropy (FAMILY_LOSS): the label shape
        # is the targets', the output's.
        "regress": (lambda: pm.Regressor(features=6, hidden=8, outputs=3), [("x", (6,), None)], (3,)),
        "regressl1": (lambda: pm.Regressor(features=6, hidden=8, outputs=3), [("x", (6,), None)], (3,)),
        "regresshuber": (lambda: pm.Regressor(features=6, hidden=8, outputs=3), [("x", (6,), None)], (3,)),
        "denoise": (lambda: pm.DenoisingAutoencoder(channels=2, width=4), [("x", (2, 8, 8), None)], (2, 8, 8)),
        "ctr": (lambda: pm.DLRM(dense=5, tables=3, rows=7, dim=4, bottom=(8, 4), top=(8, 1)), [("x0", (5,), None), ("x1", (3,), 7)], ()),
        "multilabel": (lambda: pm.TransformerClassifier(vocab=11, T=6, d=8, heads=2, layers=1, classes=6), [("x", (6,), 11)], (6,)),
        # The same with a positive weight a label (FAMILY_POS_WEIGHT).
        "multilabelpw": (lambda: pm.TransformerClassifier(vocab=11, T=6, d=8, heads=2, layers=1, classes=6), [("x", (6,), 11)], (6,)),
        # A class a pixel, the classes on axis 1 of the logits [N, 5, 6, 6].
        "segment": (lambda: pm.UNet(channels=2, width=4, classes=CLASSES, image=6), [("x", (2, 6, 6), None)], (6, 6)),
        # The same with class weights and label smoothing (FAMILY_CLASS_WEIGHT).
        "segmentcw": (lambda: pm.UNet(channels=2, width=4, classes=CLASSES, image=6), [("x", (2, 6, 6), None)], (6, 6)),
    }


# The families trained with another loss than the cross-entropy: squared,
# absolute or Huber error against float targets, binary cross-entropy of
# logits against targets in [0, 1] (soft ones for multilabel, clicks for
# ctr: one logit a sample against y of shape [N]).
FAMILY_LOSS = {"regress": "mse", "denoise": "mse", "ctr": "bce", "multilabel": "bce", "multilabelpw": "bce", "regressl1": "l1",
               "regresshuber": "huber"}
LOSSES = ["ce", "mse", "bce", "l1", "huber"]  # FAMILY_LOSS's, numbered for ref.safetensors's __loss
FAMILY_SMOOTHING = {"smooth": 0.1, "segmentcw": 0.1}
# bce's pos_weight, one a label; the cross-entropy's weight=, one a class.
FAMILY_POS_WEIGHT = {"multilabelpw": [0.5, 1, 2, 4, 1, 3]}
# An embedding's padding_idx: its table's name and the row.
FAMILY_PADDING = {"paddingidx": ("emb.weight", 0)}
FAMILY_CLASS_WEIGHT = {"segmentcw": [0.5, 1, 2, 1, 0.25]}
# Gradients clipped to this norm over the model before each step (the
# tied GPT: its tied tensor counts once).
FAMILY_CLIP = {"clipgpt": 0.05}


def loss_of(name, out, y):
    """The family's loss summed over the micro-batch."""
    kind = FAMILY_LOSS.get(name, "ce")
    if kind == "mse":
        return F.mse_loss(out, y.reshape(out.shape), reduction="sum")
    if kind == "l1":
        return F.l1_loss(out, y.reshape(out.shape), reduction="sum")
    if kind == "huber":
        return F.huber_loss(out, y.reshape(out.shape), reduction="sum", delta=1.0)
    if kind == "bce":
        pw = torch.tensor(FAMILY_POS_WEIGHT[name], dtype=out.dtype) if name in FAMILY_POS_WEIGHT else None
        return F.binary_cross_entropy_with_logits(out, y.reshape(out.shape), reduction="sum", pos_weight=pw)
    eps = FAMILY_SMOOTHING.get(name, 0.0)
    w = torch.tensor(FAMILY_CLASS_WEIGHT[name], dtype=out.dtype) if name in FAMILY_CLASS_WEIGHT else None
    if out.dim() > 2 and tuple(out.shape[2:]) == tuple(y.shape[1:]):  # classes on axis 1
        return F.cross_entropy(out, y, weight=w, reduction="sum", label_smoothing=eps)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), weight=w, reduction="sum", label_smoothing=eps)


def targets(name, shape, g):
    """Random targets of the family's loss: classes, values or probabilities."""
    kind = FAMILY_LOSS.get(name, "ce")
    if kind in ("mse", "l1", "huber"):  # some beyond huber's bend at 1
        return 2 * torch.randn(*shape, generator=g)
    if kind == "bce":
        return torch.rand(*shape, generator=g) if name.startswith("multilabel") else torch.randint(0, 2, shape, generator=g).float()
    y = torch.randint(0, CLASSES, shape, generator=g)
    if name in ("padlm", "smooth"):  # each sequence's tail from a random length on is padding
        length = torch.randint(1, shape[-1] + 1, shape[:-1] + (1,), generator=g)
        y[torch.arange(shape[-1]).expand(shape) >= length] = -100
    return y


# MobileNetV2's BatchNorm over a few 2x2 feature maps is so ill-conditioned
# that float32 and float64 differ by 5e-4 in PyTorch itself at micro-batches
# of 5, 4 and 3: it is compared on whole mini-batches.
# Its training on random labels at LR diverges at once (loss 1.65, 2.24,
# 4.1): PyTorch's own float32 run differs from its float64 one by 8% of the
# weights after two steps, so it is compared on the first step; its
# gradients that are zero in exact arithmetic (biases before a BatchNorm)
# are 3e-7 in float32.
FAMILY_MICRO = {"mobilenet": [BATCH]}
# The largest of the others train 5 steps, not 20, to keep make test short.
FAMILY_STEPS = {"mobilenet": 1, "mobilenetv3": 5, "swin": 5}
FAMILY_TOL = {"mobilenet": 1e-3}
FAMILY_OPSET = {"tutorial": 14}
# torchvision's deep CNNs reach 1x1 maps at 32x32, where BatchNorm over a
# dozen values is as ill-conditioned as MobileNetV2's.
for _n in ("tv_efficientnet", "tv_convnext", "tv_regnet", "tv_shufflenet", "tv_densenet", "tv_googlenet", "tv_squeezenet", "tv_resnext", "tv_mnasnet", "tv_vit"):
    FAMILY_MICRO[_n], FAMILY_STEPS[_n], FAMILY_TOL[_n] = [BATCH], 1, 1e-3


def family(name, outdir):
    make, inputs, labels = families()[name]
    micro = FAMILY_MICRO.get(name, MICRO)
    torch.manual_seed(0)
    model = make()
    g = torch.Generator().manual_seed(1)
    xs = []
    for _, shape, hi in inputs:
        if hi is None:
            xs.append(torch.randn(STEPS, BATCH, *shape, generator=g))
        else:
            xs.append(torch.randint(0, hi, (STEPS, BATCH, *shape), generator=g))
    ys = targets(name, (STEPS, BATCH, *labels), g)
    names = [n for n, _, _ in inputs]
    pm.export_onnx(model, tuple(x[0, :2] for x in xs), outdir + "/model.onnx", names, FAMILY_OPSET.get(name, 13))
    steps = FAMILY_STEPS.get(name, STEPS)
    xs, ys = [x[:steps] for x in xs], ys[:steps]
    out = {"__y": ys.numpy().astype(np.float32), "__micro": np.array(micro, dtype=np.float32),
           "__tol": np.array([FAMILY_TOL.get(name, 1e-4)]),
           "__loss": np.array([LOSSES.index(FAMILY_LOSS.get(name, "ce"))], dtype=np.float32),
           "__smoothing": np.array([FAMILY_SMOOTHING.get(name, 0.0)], dtype=np.float32),
           "__clip": np.array([FAMILY_CLIP.get(name, 0.0)])}
    if name in FAMILY_POS_WEIGHT:
        out["__pos_weight"] = np.array(FAMILY_POS_WEIGHT[name], dtype=np.float32)
    if name in FAMILY_CLASS_WEIGHT:
        out["__class_weight"] = np.array(FAMILY_CLASS_WEIGHT[name], dtype=np.float32)
    if name in FAMILY_PADDING:
        table, row = FAMILY_PADDING[name]
        out["__padding/" + table] = np.array([row], dtype=np.float32)
    for n, x in zip(names, xs):
        key = "__x" if len(names) == 1 else "__" + n
        out[key] = x.numpy().astype(np.float32)
    per = int(np.prod(labels)) if labels else 1
    model = model.double()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def one(s):
        total, lo = 0.0, 0
        # The mean over the labels that count (-100 is ignored), or their
        # class weights.
        count = int((ys[s] != -100).sum()) if FAMILY_LOSS.get(name, "ce") == "ce" else BATCH * per
        if name in FAMILY_CLASS_WEIGHT:
            y = ys[s].reshape(-1)
            count = float(torch.tensor(FAMILY_CLASS_WEIGHT[name], dtype=torch.float64)[y[y != -100]].sum())
        for n in micro:
            args = [x[s, lo:lo + n].double() if x.is_floating_point() else x[s, lo:lo + n] for x in xs]
            out_ = model(*args)
            y = ys[s, lo:lo + n]
            loss = loss_of(name, out_, y.double() if y.is_floating_point() else y) / count
            loss.backward()
            total += loss.item()
            lo += n
        return total

    losses = []
    for s in range(steps):
        opt.zero_grad()
        loss = one(s)
        losses.append(loss)
        if s == 0:
            out["loss1"] = np.array([loss])
            for n, p in model.named_parameters():
                out["grad1/" + n] = p.grad.detach().clone().numpy()
        if name in FAMILY_CLIP:
            torch.nn.utils.clip_grad_norm_(model.parameters(), FAMILY_CLIP[name])
        opt.step()
    seen = set()
    for n, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:  # a tied tensor's second name
            continue
        seen.add(id(t))
        if n.endswith("num_batches_tracked"):
            out["__nbt"] = np.array([t.item()])
        else:
            out["value20/" + n] = t.detach().clone().numpy()
    out["__losses"] = np.array(losses)
    write_safetensors(outdir + "/ref.safetensors", out)


def family_data(name, path, n, seed=2):
    """Writes an .npz of n samples for family name: its inputs (x, or x0,
    x1, ...; ids as int64) and labels y whose class depends on the inputs."""
    _, inputs, labels = families()[name]
    g = torch.Generator().manual_seed(seed)
    arrays, score = {}, torch.zeros(n)
    for k, (iname, shape, hi) in enumerate(inputs):
        key = "x" if len(inputs) == 1 else iname
        if hi is None:
            x = torch.randn(n, *shape, generator=g)
            score += x.reshape(n, -1)[:, :4].sum(1)
            arrays[key] = x.numpy().astype(np.float32)
        else:
            x = torch.randint(0, hi, (n, *shape), generator=g)
            score += (x.reshape(n, -1)[:, 0] % 2).float()
            arrays[key] = x.numpy().astype(np.int64)
    kind = FAMILY_LOSS.get(name, "ce")
    if kind in ("mse", "l1", "huber"):  # values the inputs determine: a sum for each target
        x = next(torch.from_numpy(a) for a in arrays.values() if a.dtype == np.float32).reshape(n, -1)
        per = int(np.prod(labels)) if labels else 1
        y = (x[:, :per] + 0.5 * x[:, -per:] + 0.1 * torch.randn(n, per, generator=g)).reshape(n, *labels)
        np.savez(path, y=y.numpy().astype(np.float32), **arrays)
        return
    if kind == "bce":  # a click or a label each where the score says
        y = (score.reshape(n, *([1] * len(labels))) + torch.randn(n, *labels, generator=g) > score.median()).float()
        np.savez(path, y=y.numpy().astype(np.float32), **arrays)
        return
    if name == "segment":  # a pixel's class: where its first channel's value falls
        x = torch.from_numpy(arrays["x"])[:, 0]
        y = torch.bucketize(x, torch.tensor([-0.8, -0.25, 0.25, 0.8]))
        np.savez(path, y=y.numpy().astype(np.int64), **arrays)
        return
    if labels:
        ids = [x for x in arrays.values() if x.dtype == np.int64 and x.shape[1:] == tuple(labels)][-1]
        y = np.roll(ids, -1, axis=1) % CLASSES  # the next id: a language model's target
        if name == "padlm":  # a random tail of each sequence is padding, its labels ignored
            length = torch.randint(1, y.shape[1] + 1, (n, 1), generator=g).numpy()
            y = np.where(np.arange(y.shape[1]) >= length, -100, y)
    else:
        y = (score > score.median()).long().numpy() + 2 * (torch.rand(n, generator=g) > 0.5).long().numpy()
    np.savez(path, y=y.astype(np.int64), **arrays)


def main():
    if sys.argv[1] == "--each":
        # --each DIR N NAME...: DIR/NAME/ for every family, with N samples of data
        # (one interpreter for all: importing torch takes seconds).
        root, n = sys.argv[2], int(sys.argv[3])
        for name in sys.argv[4:]:
            os.makedirs(os.path.join(root, name), exist_ok=True)
            export(name, os.path.join(root, name), n)
        return
    n = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--data" else 0
    export(sys.argv[1], sys.argv[2], n)


def export(name, outdir, n):
    if n:
        family_data(name, outdir + "/data.npz", n)
    if name in families():
        family(name, outdir)
        return
    cls = {"mlp": MLP, "resnet": ResNet, "towers": Towers, "convnet": ConvNet}[name]
    torch.manual_seed(0)
    model = cls()
    torch.onnx.export(
        model, torch.randn(2, *cls.shape), outdir + "/model.onnx",
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=13,
        input_names=["x"], output_names=["logits"], dynamic_axes={"x": {0: "batch"}},
    )
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, BATCH, *cls.shape, generator=g)
    ys = torch.randint(0, CLASSES, (STEPS, BATCH), generator=g)
    out = {"__x": xs.numpy(), "__y": ys.numpy().astype(np.float32)}

    model = model.double()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for s in range(STEPS):
        opt.zero_grad()
        loss = step(model, xs[s].double(), ys[s])
        if s == 0:
            out["loss1"] = np.array([loss])
            for n, p in model.named_parameters():
                out["grad1/" + n] = p.grad.detach().clone().numpy()
        opt.step()
    seen = set()
    for n, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:  # a tied tensor's second name
            continue
        seen.add(id(t))
        if n.endswith("num_batches_tracked"):
            out["__nbt"] = np.array([t.item()])
        else:
            out["value20/" + n] = t.detach().clone().numpy()
    write_safetensors(outdir + "/ref.safetensors", out)


if __name__ == "__main__":
    main()
