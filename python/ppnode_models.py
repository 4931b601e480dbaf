"""PyTorch definitions of ppnode's zoo models, for ppnode's weights.

Each module's state_dict has the names and shapes of the weights file that
`ppnode train --out` (or `ppnode ckpt export`) writes for the same model, so

    tensors, meta = read_safetensors("w.safetensors")
    model = from_meta(meta, tensors)          # or mlp32(...), resnet50(...), ...
    model.load_state_dict(tensors, strict=True)

works as it is. Inputs are NCHW as usual in PyTorch; ppnode's built-in data
sets are NHWC ([28, 28, 1] for MNIST), so the metadata's input_shape is
[H, W, C] for them; to_nchw converts such arrays. Where ppnode flattens a
feature map it does so in NHWC order, and these modules do the same.
"""
import collections
import json
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_safetensors(path):
    """Returns the tensors (as torch tensors) and the metadata of a file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    dtypes = {"F32": "<f4", "I64": "<i8"}
    tensors = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(body[a:b], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors, meta


def scaled(n, width):
    return max(1, int(round(n * width)))


class NHWCFlatten(nn.Module):
    """Flattens an NCHW feature map in ppnode's (NHWC) order."""

    def forward(self, x):
        if x.dim() == 4:
            x = x.permute(0, 2, 3, 1)
        return torch.flatten(x, 1)


def mlp32(width, inputs, classes):
    mods, n = [("flatten", NHWCFlatten())], inputs
    for i in range(1, 32):
        mods += [("fc%d" % i, nn.Linear(n, width)), ("relu%d" % i, nn.ReLU())]
        n = width
    mods.append(("fc32", nn.Linear(n, classes)))
    return nn.Sequential(collections.OrderedDict(mods))


class VGG16(nn.Module):
    """VGG-16 with BatchNorm: conv1..conv13, bn1..bn13, fc1..fc3."""

    def __init__(self, width, input_hwc, classes):
        super().__init__()
        h, w, c = input_hwc
        self.plan, k = [], 0
        for convs in [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]:
            for ch in convs:
                k += 1
                out = scaled(ch, width)
                setattr(self, "conv%d" % k, nn.Conv2d(c, out, 3, 1, 1, bias=False))
                setattr(self, "bn%d" % k, nn.BatchNorm2d(out))
                self.plan.append(k)
                c = out
            pool = h >= 2 and w >= 2
            self.plan.append("pool" if pool else None)
            if pool:
                h, w = h // 2, w // 2
        hidden = scaled(4096, width)
        self.fc1, self.fc2, self.fc3 = nn.Linear(h * w * c, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)
        self.flatten = NHWCFlatten()

    def forward(self, x):
        for p in self.plan:
            if p == "pool":
                x = F.max_pool2d(x, 2, 2)
            elif p is not None:
                x = F.relu(getattr(self, "bn%d" % p)(getattr(self, "conv%d" % p)(x)))
        x = F.dropout(F.relu(self.fc1(self.flatten(x))), 0.5, self.training)
        x = F.dropout(F.relu(self.fc2(x)), 0.5, self.training)
        return self.fc3(x)


class Bottleneck(nn.Module):
    def __init__(self, cin, planes, stride, downsample):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, 4 * planes, 1, bias=False), nn.BatchNorm2d(4 * planes)
        self.downsample = None
        if downsample:
            self.downsample = nn.Sequential(nn.Conv2d(cin, 4 * planes, 1, stride, bias=False), nn.BatchNorm2d(4 * planes))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    """ResNet-50 with the small-image stem (one 3x3 convolution, no max
    pooling), names as torchvision's."""

    def __init__(self, width, channels, classes):
        super().__init__()
        c = scaled(64, width)
        self.conv1, self.bn1 = nn.Conv2d(channels, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)
        for li, blocks in enumerate([3, 4, 6, 3]):
            planes, mods = scaled(64 << li, width), []
            for bi in range(blocks):
                stride = 2 if bi == 0 and li > 0 else 1
                mods.append(Bottleneck(c, planes, stride, bi == 0))
                c = 4 * planes
            setattr(self, "layer%d" % (li + 1), nn.Sequential(*mods))
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Uno(nn.Module):
    """Input towers on feature slices, concatenated into an MLP head."""

    def __init__(self, width, features, classes, towers=3):
        super().__init__()
        units = scaled(1000, width)
        self.bounds = [(t * features // towers, (t + 1) * features // towers) for t in range(towers)]
        for t, (lo, hi) in enumerate(self.bounds):
            tower, n = nn.Module(), hi - lo
            for i in range(1, 4):
                setattr(tower, "fc%d" % i, nn.Linear(n, units))
                n = units
            setattr(self, "tower%d" % (t + 1), tower)
        self.head = nn.Module()
        n = units * towers
        for i in range(1, 4):
            setattr(self.head, "fc%d" % i, nn.Linear(n, units))
            n = units
        self.out = nn.Linear(n, classes)
        self.flatten = NHWCFlatten()

    def forward(self, x):
        x = self.flatten(x)
        outs = []
        for t, (lo, hi) in enumerate(self.bounds):
            y, tower = x[:, lo:hi], getattr(self, "tower%d" % (t + 1))
            for i in range(1, 4):
                y = F.relu(getattr(tower, "fc%d" % i)(y))
            outs.append(y)
        x = torch.cat(outs, 1)
        for i in range(1, 4):
            x = F.relu(getattr(self.head, "fc%d" % i)(x))
        return self.out(x)


def from_meta(meta, tensors):
    """Builds the zoo model a weights file's metadata names."""
    shape, classes = json.loads(meta["input_shape"]), int(meta["classes"])
    width = float(meta["width"]) if "width" in meta else None
    model = meta["model"]
    if model == "mlp32":
        return mlp32(tensors["fc1.weight"].shape[0], int(np.prod(shape)), classes)
    if model == "vgg16":
        return VGG16(width or 1, shape, classes)
    if model == "resnet50":
        return ResNet50(width or 1, shape[-1], classes)
    if model == "uno":
        return Uno(width or 1, int(np.prod(shape)), classes)
    raise ValueError("not a zoo model: %r (an ONNX model's weights load into the module it was exported from)" % model)


def to_nchw(x):
    """Turns ppnode's NHWC images [N, H, W, C] into PyTorch's NCHW."""
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if x.ndim == 4 else x
