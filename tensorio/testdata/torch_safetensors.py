"""PyTorch side of tensorio's safetensors interoperability test.

torch 1.13 (Debian's python3-torch) has no safetensors module, so this script
reads and writes the format by hand with json and numpy, then hands the data
to torch:

  torch_safetensors.py IN OUT   parse IN and build torch tensors from it;
                                build torch tensors (fixed seed, special
                                values) and write them to OUT; print JSON
                                {"read": R, "write": W}, each R and W being
                                {"metadata": {...}, "tensors": {name:
                                {"dtype", "shape", "bits"}}} where bits are
                                the uint32 patterns of tensor.float(), for a
                                bit-exact comparison.

Exits with status 77 when torch or numpy cannot be imported.
"""
import json
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print("cannot import torch/numpy:", e, file=sys.stderr)
    sys.exit(77)

NP = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
      "U8": np.uint8, "F16": np.float16, "BF16": np.int16}
TORCH = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32,
         "I64": torch.int64, "U8": torch.uint8, "F16": torch.float16,
         "BF16": torch.bfloat16}


def describe(tensors, dtypes):
    out = {}
    for name, t in tensors.items():
        f = t.float().contiguous().reshape(-1)
        out[name] = {"dtype": dtypes[name], "shape": list(t.shape),
                     "bits": f.numpy().view(np.uint32).tolist()}
    return out


def read(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = buf[8 + n:]
    tensors, dtypes = {}, {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(body[b:e], dtype=NP[info["dtype"]]).copy()
        t = torch.from_numpy(arr)
        if info["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        tensors[name] = t.reshape(info["shape"])
        dtypes[name] = info["dtype"]
    return {"metadata": meta, "tensors": describe(tensors, dtypes)}


def write(path):
    torch.manual_seed(1234)
    a = torch.randn(3, 5, dtype=torch.float32)
    a.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), float("-inf"),
                                   -0.0, 1e-45, -3.4028235e38])
    tensors = {
        "layer0.weight": a,
        "layer0.bias": torch.randn(5, dtype=torch.float32),
        "f64": torch.randn(2, 3, dtype=torch.float64),
        "f16": torch.tensor([1.0, -2.5, 65504.0, 6e-8, float("inf"), -0.0],
                            dtype=torch.float16).reshape(2, 3),
        "bf16": torch.randn(4, dtype=torch.float32).to(torch.bfloat16),
        "labels": torch.arange(-3, 7, dtype=torch.int64),
        "i32": torch.tensor([[1, -2], [3, 2**24]], dtype=torch.int32),
        "u8": torch.tensor([0, 7, 255], dtype=torch.uint8),
        "scalar": torch.tensor(3.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }
    dtypes = {n: next(k for k, v in TORCH.items() if v == t.dtype) for n, t in tensors.items()}
    # Reference layout: by dtype (reference enum order, widest first), then name.
    rank = {"U8": 1, "F16": 7, "BF16": 8, "I32": 9, "F32": 11, "F64": 12, "I64": 13}
    order = sorted(tensors, key=lambda n: (-rank[dtypes[n]], n))
    header = {"__metadata__": {"format": "pt", "source": "torch"}}
    chunks, off = [], 0
    for name in order:
        t = tensors[name].contiguous()
        if dtypes[name] == "BF16":
            data = t.view(torch.int16).numpy().tobytes()
        else:
            data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[name], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
    return {"metadata": header["__metadata__"], "tensors": describe(tensors, dtypes)}


if __name__ == "__main__":
    json.dump({"read": read(sys.argv[1]), "write": write(sys.argv[2])}, sys.stdout)
