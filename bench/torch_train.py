"""PyTorch reference for ppnode's single-process training speed.

Builds the same models as ppnode's zoo (mlp32; resnet50 with the small-image
stem) in plain PyTorch, and trains them the way ppnode does: each mini-batch is
cut into micro-batches whose gradients are accumulated, then SGD with momentum
steps once. Prints one JSON line with samples_per_sec.

Run with Debian's interpreter: /usr/bin/python3 bench/torch_train.py --model mlp32 --steps 100
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp32(width, inputs, classes):
    layers, n = [], inputs
    for i in range(31):
        layers += [nn.Linear(n, width), nn.ReLU()]
        n = width
    layers.append(nn.Linear(n, classes))
    return nn.Sequential(nn.Flatten(), *layers)


class Bottleneck(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, 4 * planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * planes)
        self.down = None
        if stride != 1 or cin != 4 * planes:
            self.down = nn.Sequential(nn.Conv2d(cin, 4 * planes, 1, stride, bias=False), nn.BatchNorm2d(4 * planes))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def resnet50(width, channels, classes):
    c = max(1, round(64 * width))
    mods = [nn.Conv2d(channels, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
    for li, blocks in enumerate([3, 4, 6, 3]):
        planes = max(1, round((64 << li) * width))
        for bi in range(blocks):
            stride = 2 if bi == 0 and li > 0 else 1
            mods.append(Bottleneck(c, planes, stride))
            c = 4 * planes
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp32")
    ap.add_argument("--width", type=float, default=0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--channels-last", action="store_true")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.model == "mlp32":
        model = mlp32(int(a.width or 512), 784, 10)
        shape = (1, 28, 28)
    elif a.model == "resnet50":
        model = resnet50(a.width or 1.0, 3, 10)
        shape = (3, 32, 32)
    else:
        raise SystemExit("unknown model " + a.model)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt) if a.channels_last else model
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    B, M = a.batch, a.micro_batches
    xs = torch.randn(8, B, *shape).contiguous(memory_format=fmt) if a.channels_last else torch.randn(8, B, *shape)
    ys = torch.randint(0, 10, (8, B))
    sizes = [B // M + (1 if m < B % M else 0) for m in range(M)]
    start = time.time()
    for s in range(a.steps):
        x, y = xs[s % 8], ys[s % 8]
        lo = 0
        for n in sizes:
            loss = F.cross_entropy(model(x[lo : lo + n]), y[lo : lo + n], reduction="sum") / B
            loss.backward()
            lo += n
        opt.step()
        opt.zero_grad(set_to_none=False)
    sec = time.time() - start
    print(json.dumps({"impl": "pytorch", "model": a.model, "threads": torch.get_num_threads(), "steps": a.steps,
                      "batch": B, "micro_batches": M, "samples_per_sec": a.steps * B / sec, "seconds": sec}))


if __name__ == "__main__":
    main()
