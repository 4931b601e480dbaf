"""A byte-level language-model data set from Debian's fortunes (English text).

Usage: /usr/bin/python3 bench/text_data.py [--out fortunes.npz] [--ctx 128] [--dir /usr/share/games/fortunes]

Reads the plain text files of the directory (package `fortunes`: not the
.dat index files, not the .u8 links that duplicate the text, not
subdirectories) in sorted name order and concatenates their bytes. The
first 90% of the bytes are for training, the last 10% for testing; each
part is cut into non-overlapping windows of ctx+1 bytes (the tail shorter
than a window is dropped), x = window[:-1] and y = window[1:], both int64
[N, ctx]: the token at each position and the next one. Writes x, y,
x_test and y_test with numpy.savez, which `ppnode train --data` and
bench/torch_ref.py read (python/export_models.py gpt takes x).
"""
import argparse
import os

import numpy as np


def read_text(directory):
    """The bytes of the directory's text files in sorted name order, and
    the files read."""
    names = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith(".dat") or name.endswith(".u8") or os.path.islink(path) or not os.path.isfile(path):
            continue
        names.append(name)
    data = b"".join(open(os.path.join(directory, n), "rb").read() for n in names)
    return data, names


def windows(data, ctx):
    """Non-overlapping windows of ctx+1 bytes: (x, y), int64 [N, ctx]."""
    n = len(data) // (ctx + 1)
    w = np.frombuffer(data[: n * (ctx + 1)], dtype=np.uint8).astype(np.int64).reshape(n, ctx + 1)
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/usr/share/games/fortunes")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--out", default="fortunes.npz")
    a = ap.parse_args()
    data, names = read_text(a.dir)
    if not data:
        raise SystemExit("no text in %s (is Debian's fortunes package installed?)" % a.dir)
    cut = int(len(data) * 0.9)
    x, y = windows(data[:cut], a.ctx)
    xt, yt = windows(data[cut:], a.ctx)
    np.savez(a.out, x=x, y=y, x_test=xt, y_test=yt)
    vocab = int(max(x.max(), y.max(), xt.max(), yt.max())) + 1
    print("%s: %d files, %d bytes (%d distinct, largest %d); train %d windows, test %d windows of %d+1 bytes"
          % (a.out, len(names), len(data), len(set(data)), vocab - 1, len(x), len(xt), a.ctx))


if __name__ == "__main__":
    main()
