"""Writes a denoising data set: Debian's Fashion-MNIST images with Gaussian
noise as x and the clean images as y, both float32 [N, 1, 28, 28], for a
model trained with ppnode's squared error (float targets take --loss mse
unasked).

Usage: /usr/bin/python3 python/noisy_images.py OUT.npz [--train N] [--test N] [--noise S] [--seed S]

The images are scaled to [0, 1]; the noise has standard deviation S
(default 0.3) and is drawn from a generator seeded with --seed. x_test and
y_test come from the set's test images. Needs the dataset-fashion-mnist
package (/usr/share/datasets/fashion-mnist).
"""
import argparse
import gzip

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist"


def read_images(path):
    """An IDX file of unsigned-byte images [N, H, W] as float32 in [0, 1]."""
    with gzip.open(path, "rb") as f:
        b = f.read()
    if b[:4] != b"\x00\x00\x08\x03":
        raise SystemExit("%s: not an IDX file of images" % path)
    n, h, w = (int.from_bytes(b[4 + 4 * i: 8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(b, dtype=np.uint8, count=n * h * w, offset=16).reshape(n, h, w).astype(np.float32) / 255


def noisy(clean, noise, rng):
    """(x, y): clean images with noise added, and the clean ones, [N, 1, H, W]."""
    y = clean[:, None]
    return (y + rng.normal(0, noise, y.shape)).astype(np.float32), y


def make(path, train=6000, test=1000, noise=0.3, seed=1):
    rng = np.random.default_rng(seed)
    x, y = noisy(read_images(FASHION + "/train-images-idx3-ubyte.gz")[:train], noise, rng)
    xt, yt = noisy(read_images(FASHION + "/t10k-images-idx3-ubyte.gz")[:test], noise, rng)
    np.savez(path, x=x, y=y, x_test=xt, y_test=yt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    make(a.out, a.train, a.test, a.noise, a.seed)


if __name__ == "__main__":
    main()
