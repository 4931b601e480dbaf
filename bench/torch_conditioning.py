"""How far PyTorch's own float32 gradients are from its float64 ones, the
yardstick for ppnode's parity with PyTorch on ill-conditioned models.

Usage: OMP_NUM_THREADS=2 /usr/bin/python3 bench/torch_conditioning.py MODEL... [--size S ...]

MODEL is a torchvision classifier (resnext50_32x4d, densenet121, ...), built
as onnx/testdata/torch_onnx.py's tv_* families are (5 classes, dropout off,
stochastic depth off where it has one), trained one step on a random batch
of 12 at each size (default 32): prints, per model and size, the largest
difference of a parameter's gradient in float32 from float64, in units of
that gradient's largest magnitude (at least 1e-3), as the parity test
measures ppnode's.
"""
import copy
import sys

import torch
import torchvision


def worst(name, size):
    kw = {"num_classes": 5}
    if name == "googlenet":
        kw.update(aux_logits=False, init_weights=True)
    if name.startswith(("efficientnet", "convnext")):
        kw.update(stochastic_depth_prob=0.0)
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(**kw)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    x, y = torch.randn(12, 3, size, size), torch.randint(0, 5, (12,))
    grads = {}
    for dt in (torch.float32, torch.float64):
        mm = copy.deepcopy(m).to(dt).train()
        torch.nn.functional.cross_entropy(mm(x.to(dt)), y).backward()
        grads[dt] = {n: p.grad.double() for n, p in mm.named_parameters()}
    return max(((grads[torch.float32][n] - g).abs().max() / max(g.abs().max(), 1e-3)).item()
               for n, g in grads[torch.float64].items())


def main():
    args, sizes = sys.argv[1:], []
    while "--size" in args:
        i = args.index("--size")
        sizes.append(int(args[i + 1]))
        del args[i:i + 2]
    for name in args:
        for size in sizes or [32]:
            print("%s %dx%d: float32 against float64, worst gradient %.2e" % (name, size, size, worst(name, size)), flush=True)


if __name__ == "__main__":
    main()
