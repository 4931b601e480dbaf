"""ppnode's data order in Python: which samples each micro-batch of a step holds.

data/loader.go visits a split in epoch e in the order of a permutation of
[0, N) that depends only on (seed, e): a Fisher-Yates shuffle of the
identity, i from N-1 down to 1 swapping p[i] and p[j], j = uintn(i+1),
driven by Go's math/rand/v2 PCG seeded with Seed(seed, e). uintn is
Lemire's multiply-shift with rejection on the generator's Uint64 outputs.
Mini-batch s of epoch e is perm[s*B:(s+1)*B] (the last N%B samples of an
epoch are dropped); it is cut into M micro-batches of consecutive samples,
the first B%M holding B/M+1 samples, the others B/M. Global step g is step
g % (N//B) of epoch g // (N//B).

    permutation(n, seed, epoch)                 -> numpy int64 [n]
    micro_batches(n, seed, batch, micro, step)  -> list of M numpy index arrays

Command line (data/order_python_test.go compares it with Loader.Perm):

    /usr/bin/python3 bench/data_order.py --check N SEED EPOCH
        prints the permutation of epoch, space-separated, on one line
    /usr/bin/python3 bench/data_order.py --micro N SEED BATCH MICRO STEP
        prints one line per micro-batch of global step STEP
"""
import sys

import numpy as np

M64 = (1 << 64) - 1
M128 = (1 << 128) - 1
# math/rand/v2's PCG: the 128-bit LCG state = state*MUL + INC, and the
# DXSM output function with the 64-bit multiplier CHEAP_MUL.
MUL = (2549297995355413924 << 64) | 4865540595714422341
INC = (6364136223846793005 << 64) | 1442695040888963407
CHEAP_MUL = 0xDA942042E4DD58B5


class PCG:
    """Go's math/rand/v2 PCG (PCG-DXSM, 128-bit state): PCG(seed1, seed2)
    is rand.NewPCG(seed1, seed2), that is rand.PCG.Seed(seed1, seed2): the
    state's high 64 bits are seed1, the low seed2."""

    def __init__(self, seed1, seed2):
        self.state = ((seed1 & M64) << 64) | (seed2 & M64)

    def uint64(self):
        """rand.PCG.Uint64: advance the state, then DXSM on its halves."""
        self.state = (self.state * MUL + INC) & M128
        hi, lo = self.state >> 64, self.state & M64
        hi ^= hi >> 32
        hi = (hi * CHEAP_MUL) & M64
        hi ^= hi >> 48
        hi = (hi * (lo | 1)) & M64
        return hi


def uintn(src, n):
    """data/loader.go's uintn: a uniform integer in [0, n), n > 0, by
    Lemire's multiply-shift with rejection (hi, lo = bits.Mul64(x, n);
    when lo < n, redraw while lo < (2^64 - n) % n, Go's -n % n)."""
    p = src.uint64() * n
    hi, lo = p >> 64, p & M64
    if lo < n:
        thresh = ((1 << 64) - n) % n
        while lo < thresh:
            p = src.uint64() * n
            hi, lo = p >> 64, p & M64
    return hi


_cache = {}


def permutation(n, seed, epoch):
    """The permutation of [0, n) ppnode visits in epoch (Loader.Perm), as a
    numpy int64 array. The last one computed is cached."""
    if epoch < 0:
        raise ValueError("negative epoch %d" % epoch)
    key = (n, seed & M64, epoch)
    if key in _cache:
        return _cache[key]
    p = list(range(n))
    src = PCG(seed, epoch)
    for i in range(n - 1, 0, -1):
        j = uintn(src, i + 1)
        p[i], p[j] = p[j], p[i]
    perm = np.array(p, dtype=np.int64)
    perm.setflags(write=False)
    _cache.clear()
    _cache[key] = perm
    return perm


def micro_sizes(batch, micro):
    """The sizes of a mini-batch's micro-batches: B//M + 1 for the first
    B % M, B//M for the others."""
    if not 1 <= micro <= batch:
        raise ValueError("want 1 <= micro-batches (%d) <= batch (%d)" % (micro, batch))
    return [batch // micro + (1 if m < batch % micro else 0) for m in range(micro)]


def steps_per_epoch(n, batch):
    """N // B: an epoch's last incomplete mini-batch is dropped."""
    return n // batch


def batch_indices(n, seed, batch, step):
    """The sample indices of the mini-batch of global step `step`."""
    spe = steps_per_epoch(n, batch)
    if spe == 0:
        raise ValueError("batch %d is larger than the %d samples" % (batch, n))
    epoch, s = divmod(step, spe)
    return permutation(n, seed, epoch)[s * batch : (s + 1) * batch]


def micro_batches(n, seed, batch, micro, step):
    """The index arrays of the micro-batches of global step `step` (epoch
    step // (n // batch)), in order."""
    idx = batch_indices(n, seed, batch, step)
    out, lo = [], 0
    for size in micro_sizes(batch, micro):
        out.append(idx[lo : lo + size])
        lo += size
    return out


def main(argv):
    if len(argv) == 4 and argv[0] == "--check":
        n, seed, epoch = int(argv[1]), int(argv[2]), int(argv[3])
        print(" ".join(map(str, permutation(n, seed, epoch).tolist())))
        return 0
    if len(argv) == 6 and argv[0] == "--micro":
        n, seed, batch, micro, step = (int(v) for v in argv[1:])
        for mb in micro_batches(n, seed, batch, micro, step):
            print(" ".join(map(str, mb.tolist())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
