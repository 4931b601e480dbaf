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

The second half defines models to export to ONNX (GPT, DLRM, TwoTower,
TransformerClassifier, ViT, RNNClassifier, AutoencoderClassifier, Misc,
Regressor and DenoisingAutoencoder for the regression losses, UNet for
segmentation),
export_onnx, which exports one as ppnode expects, and write_safetensors;
python/export_models.py builds and exports them from the command line.
"""
import collections
import json
import math
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


# ---------------------------------------------------------------------------
# Models exported to ONNX and trained by `ppnode train --model model.onnx`.
#
# These are written the way PyTorch users write them (shape arithmetic with
# x.size(), view, transpose, masked_fill, buffers), at small widths by
# default, so that ppnode's ONNX importer meets what real exports contain.
# python/export_models.py exports them; bench/torch_ref.py trains them in
# PyTorch the way ppnode does. With dropout 0 (every default here) PyTorch
# and ppnode compute the same function.
# ---------------------------------------------------------------------------


def write_safetensors(path, tensors, metadata=None):
    """Writes tensors (name -> torch tensor or numpy array) to a safetensors
    file that read_safetensors reads back: floating-point tensors as F32,
    integer (and boolean) tensors as I64, in name order; metadata is a dict
    of strings stored as "__metadata__"."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if a.dtype.kind in "iub":
            a, dtype = np.asarray(a, dtype="<i8", order="C"), "I64"
        else:
            a, dtype = np.asarray(a, dtype="<f4", order="C"), "F32"
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def persistent_buffers(model):
    """The names of the model's buffers that its state_dict holds (the
    buffers registered with persistent=False are left out)."""
    keys = set(model.state_dict().keys())
    return [n for n, _ in model.named_buffers() if n in keys]


def export_onnx(model, example_inputs, path, input_names, opset=13):
    """Exports model as a user does for ppnode: training mode, no constant
    folding, opset 13 (or opset: 14 for torch.triu and torch.tril in
    forward), the given input names, the output "logits", and the
    batch axis (0) of every input dynamic. If the onnx package is installed
    it then records the model's persistent buffers, comma-separated, under
    the metadata key "ppnode.buffers" (ppnode does not train them), and the
    state_dict's names of each tied tensor (one tensor under several names,
    such as a head tied to the embedding) under "ppnode.tied", so that
    ppnode's weights hold it under each name, and saves the file again;
    without onnx that step is skipped.

    Exporting in training mode runs the model once: BatchNorm's running
    statistics move, so take the initial weights (state_dict) after this."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    input_names = list(input_names)
    torch.onnx.export(
        model, example_inputs, path,
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=opset,
        input_names=input_names, output_names=["logits"],
        dynamic_axes={n: {0: "batch"} for n in input_names},
    )
    try:
        import onnx
    except ImportError:
        return
    m = onnx.load(path)
    for p in list(m.metadata_props):
        if p.key in ("ppnode.buffers", "ppnode.tied"):
            m.metadata_props.remove(p)
    p = m.metadata_props.add()
    p.key, p.value = "ppnode.buffers", ",".join(persistent_buffers(model))
    tied = tied_names(model)
    if tied:
        p = m.metadata_props.add()
        p.key, p.value = "ppnode.tied", ",".join("=".join(names) for names in tied)
    onnx.save(m, path)


def tied_names(model):
    """The state_dict's names of each tensor it holds under several."""
    by_tensor = {}
    for name, t in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(t), []).append(name)
    return [names for names in by_tensor.values() if len(names) > 1]


class SelfAttention(nn.Module):
    """Multi-head self-attention written out by hand: one Linear(d, 3d) for
    q, k and v, split, heads by view and transpose, softmax(q·kᵀ/√dₕ)·v.
    With causal=True a position sees itself and the positions before it,
    through a mask buffer [1, 1, ctx, ctx] made in __init__ (aten::tril
    does not export at opset 13) and sliced to the sequence length."""

    def __init__(self, d, heads, causal=False, ctx=None, dropout=0.0):
        super().__init__()
        assert d % heads == 0
        self.d, self.heads, self.causal = d, heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_drop, self.resid_drop = nn.Dropout(dropout), nn.Dropout(dropout)
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

    def forward(self, x):
        N, T, C = x.size()
        q, k, v = self.qkv(x).split(self.d, dim=2)
        q = q.view(N, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(N, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(N, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        if self.causal:
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(N, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """A transformer block's feed-forward part: Linear(d, 4d), GELU,
    Linear(4d, d)."""

    def __init__(self, d, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: x + attn(ln1(x)), then
    x + mlp(ln2(x))."""

    def __init__(self, d, heads, causal=False, ctx=None, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, causal, ctx, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only language model (GPT-2's layout, nanoGPT's style):
    token and learned position embeddings, blocks of causal self-attention
    and MLP, a final LayerNorm and a head, tied to the token embedding with
    tie=True as in GPT-2 and nanoGPT. Input: token ids, int64 [N, T] with
    T <= ctx; output: logits [N, T, vocab], one next-token prediction a
    position."""

    def __init__(self, vocab=256, ctx=128, d=256, heads=4, blocks=4, dropout=0.0, tie=False):
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.register_buffer("positions", torch.arange(ctx), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(d, heads, True, ctx, dropout) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.apply(self._init_weights)
        if tie:
            self.head.weight = self.tok.weight

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        N, T = idx.size()
        x = self.drop(self.tok(idx) + self.pos(self.positions[:T]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm written out: x·rsqrt(mean(x²) + eps)·weight."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary position embedding of x [N, heads, T, head dim] by the angles'
    cos and sin [ctx, head dim / 2]: pairs of neighbouring features turned,
    as LLaMA's reference code does with strided slices and a stack."""
    T = x.shape[2]
    cos, sin = cos[:T], sin[:T]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    """A LLaMA block: RMSNorm, causal attention with rotary positions (no
    biases), RMSNorm, a SwiGLU MLP (silu(x·W1)·(x·W3)·W2)."""

    def __init__(self, d, heads, ctx, hidden):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        hd = d // heads
        angles = torch.outer(torch.arange(ctx).float(), 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)))
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

    def forward(self, x):
        N, T, D = x.shape
        H = self.heads
        q, k, v = self.qkv(self.n1(x)).split(D, dim=2)
        q = rotate(q.view(N, T, H, D // H).transpose(1, 2), self.cos, self.sin)
        k = rotate(k.view(N, T, H, D // H).transpose(1, 2), self.cos, self.sin)
        v = v.view(N, T, H, D // H).transpose(1, 2)
        a = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        a = a.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        x = x + self.o((a @ v).transpose(1, 2).reshape(N, T, D))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """A decoder-only language model in LLaMA's layout: token embedding,
    LlamaBlocks, a final RMSNorm and a head (not tied). Input: token ids,
    int64 [N, T] with T <= ctx; output: logits [N, T, vocab]."""

    def __init__(self, vocab=256, ctx=128, d=256, heads=4, blocks=4, hidden=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([LlamaBlock(d, heads, ctx, hidden or 2 * d) for _ in range(blocks)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class DLRM(nn.Module):
    """Facebook's DLRM recommendation model: a bottom MLP on the dense
    features, an embedding table per categorical feature, the pairwise dot
    products of the [bottom output] + embeddings vectors (the strict lower
    triangle of their Gram matrix), concatenated with the bottom output,
    and a top MLP. Inputs: x0 dense float32 [N, dense], x1 ids int64
    [N, tables] (column i indexes table i); output: logits [N, top[-1]]."""

    def __init__(self, dense=13, tables=8, rows=1000, dim=16, bottom=(64, 16), top=(64, 2)):
        super().__init__()
        assert bottom[-1] == dim, "the bottom MLP ends at the embedding dimension"
        layers, n = [], dense
        for w in bottom:
            layers += [nn.Linear(n, w), nn.ReLU()]
            n = w
        self.bottom = nn.Sequential(*layers)
        self.emb = nn.ModuleList([nn.Embedding(rows, dim) for _ in range(tables)])
        f = tables + 1
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        layers, n = [], dim + f * (f - 1) // 2
        for i, w in enumerate(top):
            layers.append(nn.Linear(n, w))
            if i < len(top) - 1:
                layers.append(nn.ReLU())
            n = w
        self.top = nn.Sequential(*layers)

    def forward(self, x0, x1):
        z = self.bottom(x0)
        t = torch.stack([z] + [e(x1[:, i]) for i, e in enumerate(self.emb)], dim=1)
        zz = torch.bmm(t, t.transpose(1, 2))
        inter = zz[:, self.li, self.lj]
        return self.top(torch.cat([z, inter], dim=1))


class TwoTower(nn.Module):
    """A two-branch multi-modal transformer (GraphPipe's multi-modal model):
    an image tower (a Conv2d patch embedding of a [channels, image, image]
    image, learned positions, blocks) and a text tower (token embedding,
    learned positions, blocks), each normalised and mean-pooled over its
    sequence, concatenated, and a two-layer MLP head. Inputs: x0 image
    float32 [N, 3, 16, 16], x1 tokens int64 [N, 16]; output: logits
    [N, classes]."""

    def __init__(self, channels=3, image=16, patch=4, vocab=256, text=16, d=64, heads=4, blocks=2,
                 hidden=128, classes=10, dropout=0.0):
        super().__init__()
        patches = (image // patch) ** 2
        self.patch = nn.Conv2d(channels, d, patch, patch)
        self.img_pos = nn.Parameter(torch.zeros(1, patches, d))
        self.img_blocks = nn.ModuleList([Block(d, heads, dropout=dropout) for _ in range(blocks)])
        self.img_ln = nn.LayerNorm(d)
        self.tok = nn.Embedding(vocab, d)
        self.txt_pos = nn.Parameter(torch.zeros(1, text, d))
        self.txt_blocks = nn.ModuleList([Block(d, heads, dropout=dropout) for _ in range(blocks)])
        self.txt_ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(2 * d, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        nn.init.normal_(self.img_pos, std=0.02)
        nn.init.normal_(self.txt_pos, std=0.02)

    def forward(self, x0, x1):
        a = self.patch(x0).flatten(2).transpose(1, 2) + self.img_pos
        for block in self.img_blocks:
            a = block(a)
        a = self.img_ln(a).mean(dim=1)
        b = self.tok(x1) + self.txt_pos
        for block in self.txt_blocks:
            b = block(b)
        b = self.txt_ln(b).mean(dim=1)
        h = F.relu(self.fc1(torch.cat([a, b], dim=1)))
        return self.fc2(h)


class TransformerClassifier(nn.Module):
    """A sequence classifier on PyTorch's own nn.TransformerEncoder:
    token embedding + learned positions, encoder layers (batch_first,
    post-LayerNorm, ReLU), the mean over the sequence, LayerNorm, Linear.
    With pad set to a token id, that token is padding: the encoder's
    src_key_padding_mask hides it and the mean leaves it out; with
    positions="mask" too, the positions are counted over the tokens that are
    not padding, RoBERTa's way (cumsum of the mask, times the mask, padding
    at position 0 of an nn.Embedding). padding_idx is the token
    embedding's (ppnode's --padding-idx emb.weight=ID). Input: token ids
    int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, T=16, d=64, heads=4, layers=2, classes=10, dropout=0.0, pad=None, positions="learned",
                 padding_idx=None):
        super().__init__()
        self.pad = pad
        if positions == "mask":
            self.positions = nn.Embedding(T + 1, d)
        self.emb = nn.Embedding(vocab, d, padding_idx=padding_idx)
        if positions != "mask":
            self.pos = nn.Parameter(torch.zeros(1, T, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, classes)
        if positions != "mask":
            nn.init.normal_(self.pos, std=0.02)

    def forward(self, x):
        if self.pad is None:
            h = self.encoder(self.emb(x) + self.pos)
            return self.fc(self.norm(h.mean(dim=1)))
        padding = x == self.pad
        if hasattr(self, "positions"):
            keep = x.ne(self.pad).int()
            ids = (torch.cumsum(keep, dim=1).type_as(keep) * keep).long()
            h = self.encoder(self.emb(x) + self.positions(ids), src_key_padding_mask=padding)
        else:
            h = self.encoder(self.emb(x) + self.pos, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        h = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        return self.fc(self.norm(h))


class EinsumAttention(nn.Module):
    """Attention written with torch.einsum, as many research codebases do:
    projections by einsum with nn.Parameter weights ('btd,de->bte', and one
    with the weight first), scores 'bhqd,bhkd->bhqk', the weighted sum
    'bhqk,bhkd->bhqd', then a mean over the sequence and a Linear. Input:
    token ids int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, T=16, d=32, heads=4, classes=10):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.wq = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.wk = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.wv = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.fc = nn.Linear(d, classes)

    def forward(self, x):
        h = self.emb(x)
        B, T, D = h.shape
        H = self.heads
        q = torch.einsum("btd,de->bte", h, self.wq).reshape(B, T, H, D // H)
        k = torch.einsum("ed,btd->bte", self.wk.t(), h).reshape(B, T, H, D // H)
        v = torch.einsum("btd,de->bte", h, self.wv).reshape(B, T, H, D // H)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // H)
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, T, D)
        return self.fc(o.mean(1))


class ViT(nn.Module):
    """A small vision transformer: Conv2d patch embedding, a class token
    (expanded to the batch and concatenated in front), learned positions,
    hand-written pre-LayerNorm blocks, a final LayerNorm and a head on the
    class token. Input: images float32 [N, channels, image, image]; output:
    logits [N, classes]."""

    def __init__(self, channels=3, image=16, patch=4, d=64, heads=4, blocks=2, classes=10, dropout=0.0):
        super().__init__()
        patches = (image // patch) ** 2
        self.patch = nn.Conv2d(channels, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, patches + 1, d))
        self.blocks = nn.ModuleList([Block(d, heads, dropout=dropout) for _ in range(blocks)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        cls = self.cls.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)[:, 0])


class RNNClassifier(nn.Module):
    """An LSTM, GRU or plain RNN (kind 'lstm', 'gru', 'rnn' or 'rnnrelu',
    batch_first, bidirectional if asked) over feature sequences, classified from its output at the last
    step (head 'last') or from the final hidden states of the last layer's
    directions (head 'state', h_n as PyTorch returns it). Input: float32
    [N, T, features]; output: logits [N, classes]."""

    def __init__(self, kind="lstm", T=16, features=8, hidden=32, layers=1, classes=10,
                 bidirectional=False, head="last"):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN,
               "rnnrelu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k)}[kind]
        if head not in ("last", "state"):
            raise ValueError("head is 'last' or 'state', got %r" % head)
        self.T, self.features, self.head = T, features, head
        self.dirs = 2 if bidirectional else 1
        self.rnn = rnn(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(self.dirs * hidden, classes)

    def forward(self, x):
        y, h = self.rnn(x)
        if self.head == "last":
            return self.fc(y[:, -1])
        if isinstance(h, tuple):  # the LSTM's (h_n, c_n)
            h = h[0]
        return self.fc(torch.cat([h[i] for i in range(-self.dirs, 0)], dim=1))


class TextCNN(nn.Module):
    """A convolutional sequence classifier over token embeddings, for the
    1-D operators: Conv1d (padded, then strided and dilated, grouped),
    BatchNorm1d over [N, C, L], max_pool1d, AvgPool1d, F.pad,
    ConvTranspose1d, and both
    adaptive_avg_pool1d to one step and the largest value over the steps
    (amax). Input: token ids int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, T=16, d=32, width=16, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.c1 = nn.Conv1d(d, width, 3, padding=1)
        self.bn = nn.BatchNorm1d(width)
        self.c2 = nn.Conv1d(width, width, 3, stride=2, dilation=2, groups=2)
        self.avg = nn.AvgPool1d(2, ceil_mode=True)
        self.up = nn.ConvTranspose1d(width, width, 4, stride=2, padding=1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        h = self.emb(x).transpose(1, 2)
        h = F.max_pool1d(F.relu(self.bn(self.c1(h))), 2)
        h = self.up(self.avg(F.relu(self.c2(F.pad(h, (2, 2))))))
        return self.fc(torch.cat([F.adaptive_avg_pool1d(h, 1).squeeze(-1), h.amax(dim=2)], 1))


class NormAct(nn.Module):
    """More normalisations and activations: GroupNorm, InstanceNorm2d
    (affine), ELU, SELU, CELU and PixelShuffle into a convolution, a
    normalisation by hand with torch.std, torch.maximum with a constant,
    torch.flip, torch.where and torch.minimum between two tensors, PReLU
    (per channel and shared) and F.normalize. Input: images float32 [N, channels, image, image]; output:
    logits [N, classes]."""

    def __init__(self, channels=3, image=8, width=8, classes=10):
        super().__init__()
        self.c1 = nn.Conv2d(channels, width, 3, padding=1)
        self.gn = nn.GroupNorm(2, width)
        self.c2 = nn.Conv2d(width, 4 * width, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)
        self.inorm = nn.InstanceNorm2d(width, affine=True)
        self.c3 = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.prelu = nn.PReLU(width, init=0.1)
        self.prelu1 = nn.PReLU()
        self.fc = nn.Linear(width * image * image, classes)

    def forward(self, x):
        h = self.prelu(F.elu(self.gn(self.c1(x)), 0.5))
        h = F.selu(self.inorm(self.shuffle(self.c2(h))))
        h = self.prelu1(F.celu(self.c3(h), 2.0))
        h = (h - h.mean(dim=(2, 3), keepdim=True)) / (h.std(dim=(2, 3), keepdim=True) + 1e-3)
        h = torch.flip(torch.maximum(h, torch.full_like(h, -0.5)), dims=[3])
        h = torch.where(h > 0.2, h, 0.5 * h.flip(2))
        h = torch.minimum(h, 0.8 * h.flip(3) + 0.1)
        return self.fc(4 * F.normalize(torch.flatten(h, 1), dim=1))


class AutoencoderClassifier(nn.Module):
    """A convolutional encoder-decoder with a classifier head, for the
    upsampling operators: Conv2d stride 2 twice (16 -> 8 -> 4),
    ConvTranspose2d(k=4, s=2, p=1) (4 -> 8), nn.Upsample nearest ×2
    (8 -> 16), Conv2d stride 2 (16 -> 8), bilinear F.interpolate ×2
    (align_corners=False; 8 -> 16), Conv2d stride 2 (16 -> 8), Linear.
    Input: images float32 [N, channels, 16, 16]; output: logits
    [N, classes]."""

    def __init__(self, channels=3, image=16, width=8, classes=10):
        super().__init__()
        w = width
        self.enc1 = nn.Conv2d(channels, w, 3, 2, 1)
        self.enc2 = nn.Conv2d(w, 2 * w, 3, 2, 1)
        self.dec1 = nn.ConvTranspose2d(2 * w, w, 4, 2, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec2 = nn.Conv2d(w, w, 3, 2, 1)
        self.out = nn.Conv2d(w, w // 2, 3, 2, 1)
        self.fc = nn.Linear((w // 2) * (image // 2) ** 2, classes)

    def forward(self, x):
        x = F.relu(self.enc1(x))
        x = F.relu(self.enc2(x))
        x = F.relu(self.dec1(x))
        x = F.relu(self.dec2(self.up(x)))
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        x = F.relu(self.out(x))
        return self.fc(torch.flatten(x, 1))


class Regressor(nn.Module):
    """A tabular regression MLP (trained with --loss mse): Linear, LayerNorm,
    GELU, Linear. Input: features float32 [N, features]; output: values
    [N, outputs]."""

    def __init__(self, features=8, hidden=32, outputs=1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Linear(hidden, outputs))

    def forward(self, x):
        return self.net(x)


class DenoisingAutoencoder(nn.Module):
    """A convolutional autoencoder trained to reconstruct images (--loss
    mse against clean images): Conv2d stride 2 twice, ConvTranspose2d twice
    back to the input's size. Input: images float32 [N, channels, image,
    image]; output: images of the same shape."""

    def __init__(self, channels=1, width=8, image=28):
        super().__init__()
        assert image % 4 == 0, "two stride-2 convolutions and back: a side divisible by 4"
        w = width
        self.enc = nn.Sequential(nn.Conv2d(channels, w, 3, 2, 1), nn.ReLU(), nn.Conv2d(w, 2 * w, 3, 2, 1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(2 * w, w, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(w, channels, 4, 2, 1))

    def forward(self, x):
        return self.dec(self.enc(x))


class UNet(nn.Module):
    """A small U-Net for semantic segmentation (trained with the cross-entropy
    over its class axis 1, a label a pixel, as PyTorch's CrossEntropyLoss
    takes [N, classes, H, W] logits): two 3x3 convolution blocks with
    BatchNorm, max pooling, a ConvTranspose2d up, the skip connection
    concatenated, a 1x1 convolution to the classes. Input: images float32
    [N, channels, image, image] (image even); output: logits [N, classes,
    image, image]."""

    def __init__(self, channels=3, width=8, classes=5, image=32):
        super().__init__()
        assert image % 2 == 0, "one max pooling and back: an even side"
        w = width

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

        self.enc = block(channels, w)
        self.down = nn.MaxPool2d(2)
        self.mid = block(w, 2 * w)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, 2)
        self.dec = block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e = self.enc(x)
        m = self.mid(self.down(e))
        return self.head(self.dec(torch.cat([self.up(m), e], dim=1)))


class Misc(nn.Module):
    """Odds and ends: nn.ZeroPad2d, F.pad, a learnable scalar
    nn.Parameter(torch.tensor(0.5)), pooling with ceil_mode (max, and
    average without the padding counted), torch.roll both ways and
    nn.Linear without bias.
    Input: images float32 [N, channels, image, image], image even; output:
    logits [N, classes]."""

    def __init__(self, channels=3, image=8, width=4, classes=10):
        super().__init__()
        self.pad = nn.ZeroPad2d(1)
        self.conv = nn.Conv2d(channels, width, 3)
        self.scale = nn.Parameter(torch.tensor(0.5))
        # image + 1 (odd) -> image/2 + 1 -> image/4 + 1 with ceil_mode
        # (each one less without).
        self.maxpool = nn.MaxPool2d(2, ceil_mode=True)
        self.avgpool = nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False)
        side = (image // 2 + 1) // 2 + 1
        self.fc = nn.Linear(width * side * side, classes, bias=False)

    def forward(self, x):
        x = self.conv(self.pad(x))
        x = F.pad(x, (0, 1, 0, 1))
        x = F.relu(x) * self.scale
        x = torch.roll(self.avgpool(self.maxpool(x)), shifts=(1, -1), dims=(2, 3))
        return self.fc(torch.flatten(x, 1))


class Albert(nn.Module):
    """ALBERT's cross-layer sharing: one transformer Block applied depth
    times (every use reads the same weights), over token and position
    embeddings, then a mean over positions and a classifier.
    Input: token ids, int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, T=16, d=32, heads=4, depth=3, classes=10):
        super().__init__()
        self.depth = depth
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.02)
        self.block = Block(d, heads)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.tok(x) + self.pos
        for _ in range(self.depth):
            h = self.block(h)
        return self.head(self.ln(h).mean(1))


class Siamese(nn.Module):
    """A siamese pair: one encoder (Linear, ReLU, Linear) applied to both
    inputs, their difference and product concatenated into a classifier.
    Inputs: x0, x1 float32 [N, features]; output: logits [N, classes]."""

    def __init__(self, features=8, hidden=16, d=8, classes=10):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, d))
        self.head = nn.Linear(2 * d, classes)

    def forward(self, x0, x1):
        a, b = self.enc(x0), self.enc(x1)
        return self.head(torch.cat([(a - b).abs(), a * b], 1))


class Seq2Seq(nn.Module):
    """An encoder-decoder transformer as nn.Transformer builds one
    (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, whose
    cross-attention reads the encoder's output; post-norm, ReLU), with
    learned positions and a causal mask on the target.
    Inputs: x0 source ids, int64 [N, S]; x1 target ids, int64 [N, T] with
    T <= ctx; output: logits [N, T, vocab], one prediction a target
    position."""

    def __init__(self, vocab=256, S=16, ctx=16, d=64, heads=4, layers=2, hidden=None, dropout=0.0):
        super().__init__()
        hidden = hidden or 2 * d
        self.src_tok, self.tgt_tok = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.src_pos = nn.Parameter(torch.randn(1, S, d) * 0.02)
        self.tgt_pos = nn.Parameter(torch.randn(1, ctx, d) * 0.02)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, hidden, dropout, batch_first=True), layers)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, heads, hidden, dropout, batch_first=True), layers)
        self.register_buffer("causal", torch.triu(torch.full((ctx, ctx), float("-inf")), 1))
        self.head = nn.Linear(d, vocab)

    def forward(self, x0, x1):
        T = x1.shape[1]
        memory = self.encoder(self.src_tok(x0) + self.src_pos)
        h = self.decoder(self.tgt_tok(x1) + self.tgt_pos[:, :T], memory, tgt_mask=self.causal[:T, :T])
        return self.head(h)


class TutorialLM(nn.Module):
    """The language model of PyTorch's "Language Modeling with
    nn.Transformer" tutorial, batch first: embedding times sqrt(d),
    sinusoidal positions (a buffer), nn.TransformerEncoder with a causal
    mask made in forward by nn.Transformer.generate_square_subsequent_mask
    (torch.triu, which exports at opset 14: export_onnx(..., opset=14)),
    a Linear decoder. Input: token ids, int64 [N, T] with T <= ctx; output:
    logits [N, T, vocab]."""

    def __init__(self, vocab=256, ctx=128, d=64, heads=4, hidden=128, layers=2, dropout=0.0):
        super().__init__()
        self.d = d
        self.embedding = nn.Embedding(vocab, d)
        position = torch.arange(ctx).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(1, ctx, d)
        pe[0, :, 0::2] = torch.sin(position * div)
        pe[0, :, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, hidden, dropout, batch_first=True), layers)
        self.decoder = nn.Linear(d, vocab)

    def forward(self, x):
        T = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        h = self.embedding(x) * math.sqrt(self.d) + self.pe[:, :T]
        return self.decoder(self.encoder(h, mask))


class TokenPooled(nn.Module):
    """A causal transformer classifier that pools one token of each
    sequence, picked by an index computed from the ids:
    pool="last" as Hugging Face's GPT2ForSequenceClassification, the last
    token before the first padding id, (eq(x, pad).int().argmax(-1) - 1) %
    T (the last position when there is none); pool="eot" as CLIP's text
    encoder, the position of the largest id (its end-of-text token).
    Input: token ids, int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, T=16, d=32, heads=4, blocks=1, classes=10, pad=0, pool="last"):
        super().__init__()
        self.pad, self.pool = pad, pool
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads, True, T) for _ in range(blocks)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.tok(x) + self.pos
        for b in self.blocks:
            h = b(h)
        if self.pool == "eot":
            at = x.argmax(dim=-1)
        else:
            at = (torch.eq(x, self.pad).int().argmax(-1) - 1) % x.shape[-1]
        return self.head(self.ln(h)[torch.arange(h.shape[0]), at])


def t5_bucket(relative, buckets=32, max_distance=128):
    """T5's bidirectional relative position buckets (its
    _relative_position_bucket): exact for small distances, logarithmic up
    to max_distance, the sign in the upper half."""
    buckets //= 2
    ret = (relative > 0).to(torch.long) * buckets
    n = torch.abs(relative)
    exact = buckets // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (buckets - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return ret + torch.where(n < exact, n, large)


class T5Attention(nn.Module):
    """A classifier of one attention layer with T5's learned relative
    position bias: an nn.Embedding of buckets, looked up by indices that
    are computed from torch.arange in forward, added to the scores.
    Input: token ids, int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, d=32, heads=4, buckets=32, max_distance=128, classes=10):
        super().__init__()
        self.heads, self.buckets, self.max_distance = heads, buckets, max_distance
        self.tok = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.bias = nn.Embedding(buckets, heads)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        N, T = x.shape
        h = self.tok(x)
        q, k, v = (t.view(N, T, self.heads, -1).transpose(1, 2) for t in self.qkv(h).split(h.shape[-1], -1))
        relative = torch.arange(T)[None, :] - torch.arange(T)[:, None]
        bias = self.bias(t5_bucket(relative, self.buckets, self.max_distance)).permute(2, 0, 1).unsqueeze(0)
        a = (q @ k.transpose(-2, -1) + bias).softmax(-1)
        h = h + self.o((a @ v).transpose(1, 2).reshape(N, T, -1))
        return self.head(h.mean(1))


class AttentionVariants(nn.Module):
    """Attention as users call it with its defaults and options:
    nn.MultiheadAttention returning its head-averaged weights (used), a
    pre-norm nn.TransformerEncoderLayer with GELU, LayerNorm without
    affine parameters, the tanh GELU (GPT-2's), and sequences resized by
    F.interpolate (linear) and nn.Upsample (nearest) on [N, C, L].
    Input: token ids, int64 [N, T]; output: logits [N, classes]."""

    def __init__(self, vocab=256, d=32, heads=4, classes=10):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.enc = nn.TransformerEncoderLayer(d, heads, 2 * d, 0.0, activation="gelu", batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.fc = nn.Linear(d, d)
        self.up = nn.Upsample(scale_factor=2)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.tok(x)
        a, w = self.attn(h, h, h)
        h = self.enc(h + a)
        h = F.gelu(self.fc(self.ln(h)), approximate="tanh").transpose(1, 2)
        h = self.up(F.interpolate(h, scale_factor=2, mode="linear", align_corners=False))
        return self.head(h.mean(2)) + w.mean((1, 2))[:, None]


class PadModes(nn.Module):
    """Image-to-image networks' padding and repeats: nn.ReflectionPad2d and
    a Conv2d with padding_mode="replicate" (CycleGAN's ResNet blocks),
    reflect padding of sequences, and x.repeat of channels.
    Input: images float32 [N, channels, image, image]; output: logits
    [N, classes]."""

    def __init__(self, channels=3, image=8, width=4, classes=10):
        super().__init__()
        self.block = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(channels, width, 3), nn.InstanceNorm2d(width), nn.ReLU())
        self.rep = nn.Conv2d(2 * width, width, 3, padding=1, padding_mode="replicate")
        self.seq = nn.Conv1d(width, width, 3)
        self.fc = nn.Linear(width * image * image, classes)

    def forward(self, x):
        h = self.rep(self.block(x).repeat(1, 2, 1, 1))
        N, C, H, W = h.shape
        s = self.seq(F.pad(h.reshape(N, C, H * W), (1, 1), mode="reflect"))
        return self.fc(F.relu(s).flatten(1))


class CellLoop(nn.Module):
    """A recurrence written as a loop over nn.LSTMCell or nn.GRUCell from a
    zero state (made in forward), as older seq2seq tutorials do:
    the export unrolls it, every step reading the cell's weights (tied).
    Input: sequences float32 [N, T, features]; output: logits [N, classes]."""

    def __init__(self, kind="lstm", features=8, hidden=16, classes=10):
        super().__init__()
        self.kind, self.hidden = kind, hidden
        self.cell = nn.LSTMCell(features, hidden) if kind == "lstm" else nn.GRUCell(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        c = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            if self.kind == "lstm":
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return self.head(h)
