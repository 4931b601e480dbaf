"""Exports a PyTorch model to ONNX and trains it, the reference for ppnode's import.

Usage: /usr/bin/python3 torch_onnx.py MODEL OUTDIR

MODEL is mlp, resnet, towers or convnet. Writes OUTDIR/model.onnx (exported as
a user would: training mode, no constant folding, opset 13) and
OUTDIR/ref.safetensors with the data ("__x" [steps, batch, ...], "__y") and,
from float64 runs of the same float32 initial weights: "loss1" and
"grad1/<name>" of the first step, "value20/<name>" after 20 steps of SGD
(momentum 0.9) and "__nbt" (BatchNorm's num_batches_tracked). Names and
layouts are the state_dict's. Micro-batches are MICRO below, each its own
forward (BatchNorm statistics per micro-batch), the loss summed over the
mini-batch and divided by its size.
"""
import json
import struct
import sys

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


def main():
    name, outdir = sys.argv[1], sys.argv[2]
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
    for n, t in model.state_dict().items():
        if n.endswith("num_batches_tracked"):
            out["__nbt"] = np.array([t.item()])
        else:
            out["value20/" + n] = t.detach().clone().numpy()
    write_safetensors(outdir + "/ref.safetensors", out)


if __name__ == "__main__":
    main()
