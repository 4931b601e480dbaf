"""PyTorch DistributedDataParallel over gloo: the data-parallel reference
for ppnode's pipelines on shaped links.

One process per node; each trains mlp32 (the model of torch_train.py) on its
share of the global batch (128 over 3 ranks: 43, 43, 42 samples) of random
MNIST-shaped data, and gloo all-reduces the gradients every step (bucketed,
overlapped with the backward pass), then SGD with momentum steps. Rank 0
prints one JSON line with the global samples per second over the timed steps.

The integration harness runs it in network namespaces with shaped links
(PPNODE_LINKS=1 go test -run TestLinksDDP ./integration, see bench/links.sh):
  /usr/bin/python3 bench/ddp_gloo.py --rank R --world 3 --master 10.213.0.11:29500
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import mlp32  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--master", required=True, help="host:port of rank 0")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    host, port = a.master.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=a.rank, world_size=a.world)
    torch.manual_seed(1)
    model = DistributedDataParallel(mlp32(a.width, 784, 10))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    local = a.batch // a.world + (1 if a.rank < a.batch % a.world else 0)
    g = torch.Generator().manual_seed(a.rank)
    x = torch.randn(local, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (local,), generator=g)
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if a.rank == 0:
        print(json.dumps({"samples_per_sec": a.batch * a.steps / dt, "step_ms": 1e3 * dt / a.steps,
                          "world": a.world, "batch": a.batch, "width": a.width, "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
