"""Each model family trains in ppnode as in PyTorch: for every model of
python/export_models.py it

  1. exports the model (export_models.py: model.onnx, init.safetensors),
  2. makes a data set whose labels the model can learn (a fixed random
     teacher; for the GPT, bytes of the fortunes text),
  3. trains STEPS steps (SGD, or --optimizer) in ppnode on one process and on a cluster
     of three nodes (`train --via --partition uniform`: a stage on each,
     or the automatic plan where the planner refuses that cut), both
     --deterministic, and checks that their weights are the same bits,
  4. loads the three nodes' weights (--out) into the PyTorch module with
     load_state_dict(strict=True),
  5. trains the same steps in PyTorch (bench/torch_ref.py: same initial
     weights, data order, micro-batches, optimizer and loss) and compares
     the final training loss and the test loss: within 2%; under bce also
     the test AUC.

The families regress, denoise and ctr train with the squared error and the
binary cross-entropy (LOSS) on float targets: a teacher's values, noisy
Fashion-MNIST against the clean images (python/noisy_images.py), clicks;
segment (a U-Net) has a class a pixel, the classes on axis 1 of its logits.

Run: /usr/bin/python3 bench/families.py --ppnode /tmp/ppnode [--steps 200] [--models gpt,dlrm,...]
It starts its three nodes on 127.0.0.1 (ports from --port, default 17600)
and stops them at the end. Prints a line per model and a table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import export_models  # noqa: E402
import noisy_images  # noqa: E402
import ppnode_models as pm  # noqa: E402

# Model options: the defaults, but a smaller GPT (its full size is
# measured against PyTorch by bench/lm_vs_torch.py).
OPTIONS = {"gpt": ["--d=128", "--blocks=2", "--ctx=64"]}


def last_json(out):
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON in:\n" + out[-3000:])


# The families trained with another loss than the cross-entropy (ppnode's
# --loss; float targets take mse unasked).
LOSS = {"regress": "mse", "denoise": "mse", "ctr": "bce"}


def make_data(model, opts, path, n=2400, seed=7):
    """n samples (10% test) with labels a fixed random teacher gives: for
    regress its values, for ctr a click where its score is above the
    median; for denoise Fashion-MNIST with noise (python/noisy_images.py)."""
    m, inputs = export_models.build(model, **export_models.parse_options(opts))
    g = torch.Generator().manual_seed(seed)
    arrays = {}
    if model == "denoise":
        noisy_images.make(path, train=n * 9 // 10, test=n // 10, seed=seed)
        return
    if model == "segment":  # a pixel's class: where a smoothed channel's value falls
        x = torch.randn((n,) + tuple(inputs[0][1]), generator=g)
        s = F.avg_pool2d(x[:, :1], 3, 1, 1)[:, 0] * 3
        arrays = {"x": x.numpy().astype(np.float32),
                  "y": torch.bucketize(s, torch.tensor([-1.0, -0.3, 0.3, 1.0])).numpy().astype(np.int64)}
    elif model == "gpt":
        ctx = inputs[0][1][0]
        text = b"".join(open(os.path.join("/usr/share/games/fortunes", f), "rb").read()
                        for f in sorted(os.listdir("/usr/share/games/fortunes"))
                        if not f.endswith((".dat", ".u8")) and os.path.isfile(os.path.join("/usr/share/games/fortunes", f)))
        t = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
        w = t[: (len(t) // (ctx + 1)) * (ctx + 1)].reshape(-1, ctx + 1)[:n]
        arrays = {"x": w[:, :-1], "y": w[:, 1:]}
    else:
        classes = m(*export_models.example(inputs)).shape[-1]
        score = torch.zeros(n, classes)
        for name, shape, dtype, high in inputs:
            key = "x" if len(inputs) == 1 else name
            if dtype == torch.int64:
                x = torch.randint(0, high, (n,) + tuple(shape), generator=g)
                table = torch.randn(high, classes, generator=g)
                score += table[x.reshape(n, -1)].sum(1)
                arrays[key] = x.numpy()
            else:
                x = torch.randn((n,) + tuple(shape), generator=g)
                proj = torch.randn(x[0].numel(), classes, generator=g)
                score += x.reshape(n, -1) @ proj / x[0].numel() ** 0.5
                arrays[key] = x.numpy().astype(np.float32)
        if model == "regress":
            arrays["y"] = torch.tanh(score).numpy().astype(np.float32)
        elif model == "ctr":
            arrays["y"] = (score[:, 0] > score[:, 0].median()).numpy().astype(np.float32)
        else:
            arrays["y"] = score.argmax(1).numpy().astype(np.int64)
    k = len(arrays["y"]) * 9 // 10
    out = {}
    for key, a in arrays.items():
        out[key], out[key + "_test"] = a[:k], a[k:]
    np.savez(path, **out)


class Cluster:
    def __init__(self, ppnode, port, tmp):
        self.procs, self.http = [], f"127.0.0.1:{port + 100}"
        for i, name in enumerate("abc"):
            cmd = [ppnode, "join", "--name", name, "--bind", f"127.0.0.1:{port + i}", "--http", f"127.0.0.1:{port + 100 + i}",
                   "--data-dir", os.path.join(tmp, name), "--threads", "1", "--files", tmp]
            if i:
                cmd += ["--seeds", f"127.0.0.1:{port}"]
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, name + ".log"), "w")))
            self.wait(ppnode, i + 1)

    def wait(self, ppnode, members):
        for _ in range(240):
            st = subprocess.run([ppnode, "status", "--via", self.http, "--json"], capture_output=True, text=True)
            if st.returncode == 0 and len(last_json(st.stdout).get("members", [])) >= members:
                return
            time.sleep(0.5)
        raise RuntimeError("the nodes did not meet")

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ppnode", default="/tmp/ppnode")
    ap.add_argument("--models", default=",".join(export_models.MODELS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--port", type=int, default=17600)
    ap.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    ap.add_argument("--lr", type=float, default=0, help="peak rate (0: ppnode's default for the optimizer)")
    ap.add_argument("--weight-decay", type=float, default=0)
    ap.add_argument("--no-decay-1d", action="store_true", help="no decay for biases and norms (both sides)")
    ap.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"], default="cosine")
    ap.add_argument("--min-lr", type=float, default=0, help="the rate the schedule decays to")
    ap.add_argument("--label-smoothing", type=float, default=0, help="for the ce families (both sides)")
    ap.add_argument("--freeze", default="", help="prefixes of the parameters to freeze (both sides)")
    ap.add_argument("--class-weights", default="", help="ce's weight per class, comma-separated, for the ce families (both sides)")
    ap.add_argument("--pos-weight", default="", help="bce's positive weights, for the bce families (both sides): one, or one a label")
    ap.add_argument("--samples", type=int, default=2400, help="samples of each data set, 10%% of them for testing")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="families-")
    cluster = Cluster(a.ppnode, a.port, tmp)
    rows = []
    try:
        for model in a.models.split(","):
            d = os.path.join(tmp, model)
            opts = OPTIONS.get(model, [])
            subprocess.run([sys.executable, os.path.join(HERE, "..", "python", "export_models.py"), model, d] + opts,
                           check=True, capture_output=True)
            data = os.path.join(d, "data.npz")
            make_data(model, opts, data, n=a.samples)
            extra = ["--pos-weight", a.pos_weight] if a.pos_weight and LOSS.get(model) == "bce" else []
            extra += ["--lr-schedule", a.lr_schedule, "--min-lr", str(a.min_lr)]
            extra += ["--class-weights", a.class_weights] if a.class_weights and LOSS.get(model, "ce") == "ce" else []
            extra += ["--freeze", a.freeze] if a.freeze else []
            extra += ["--label-smoothing", str(a.label_smoothing)] if a.label_smoothing and LOSS.get(model, "ce") == "ce" else []
            common = ["--model", os.path.join(d, "model.onnx"), "--data", data, "--steps", str(a.steps),
                      "--batch", str(a.batch), "--micro-batches", str(a.micro_batches), "--optimizer", a.optimizer,
                      "--lr", str(a.lr), "--weight-decay", str(a.weight_decay), "--deterministic", "--json"] + (["--loss", LOSS[model]] if model in LOSS else []) + \
                (["--no-decay-1d"] if a.no_decay_1d else []) + extra
            t0 = time.time()
            local = last_json(subprocess.run([a.ppnode, "train", "--local"] + common, capture_output=True, text=True, check=True).stdout)
            t1 = time.time()
            out = os.path.join(d, "via.safetensors")
            # A stage on each node; where such a cut would sum a gradient in
            # another order than one process (the planner refuses it), the
            # automatic plan.
            for partition in ("uniform", "auto"):
                run = subprocess.run([a.ppnode, "train", "--via", cluster.http, "--out", out, "--partition", partition] + common,
                                     capture_output=True, text=True)
                if run.returncode == 0 or "gradient order differs" not in run.stderr:
                    break
            if run.returncode != 0:
                raise RuntimeError(f"{model}: ppnode train --via: {run.stderr[-2000:]}")
            via = last_json(run.stdout)
            t2 = time.time()
            # The three nodes' weights into the PyTorch module, strictly.
            m, _ = export_models.build(model, **export_models.parse_options(opts))
            m.load_state_dict(pm.read_safetensors(out)[0], strict=True)
            ref = last_json(subprocess.run([sys.executable, os.path.join(HERE, "torch_ref.py"), "--model", model,
                                            "--init", os.path.join(d, "init.safetensors"), "--data", data, "--steps", str(a.steps),
                                            "--batch", str(a.batch), "--micro-batches", str(a.micro_batches), "--optimizer", a.optimizer,
                                            "--lr", str(a.lr), "--weight-decay", str(a.weight_decay), "--threads", "1", "--loss", LOSS.get(model, "ce")] + opts +
                                           (["--no-decay-1d"] if a.no_decay_1d else []) + extra,
                                           capture_output=True, text=True, check=True).stdout)
            same = local["weights_sha256"] == via["weights_sha256"]
            dtrain = abs(via["train_loss"] - ref["train_loss"]) / ref["train_loss"]
            dtest = abs(via["test_loss"] - ref["test_loss"]) / ref["test_loss"]
            row = dict(model=model, loss=via.get("loss", "ce"), params=via["params"], plan=via["plan"], nodes=len(via.get("nodes", [])), same_bits=same,
                       strict_load=True, first_loss=via["loss_history"][0][1], ppnode_train=via["train_loss"], torch_train=ref["train_loss"],
                       ppnode_test=via["test_loss"], torch_test=ref["test_loss"], d_train=dtrain, d_test=dtest,
                       ppnode_auc=via.get("test_auc"), torch_auc=ref.get("test_auc"),
                       local_s=t1 - t0, via_s=t2 - t1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        cluster.stop()
    print("| model | loss | params | nodes | --local = 3 nodes | strict load | first loss | train loss ppnode / PyTorch | test loss ppnode / PyTorch | worst difference | test AUC ppnode / PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        auc = f"{r['ppnode_auc']:.6f} / {r['torch_auc']:.6f}" if r["torch_auc"] is not None else ""
        print(f"| {r['model']} | {r['loss']} | {r['params']} | {r['nodes']} | {'yes' if r['same_bits'] else 'NO'} | yes | {r['first_loss']:.4f} | "
              f"{r['ppnode_train']:.4f} / {r['torch_train']:.4f} | {r['ppnode_test']:.4f} / {r['torch_test']:.4f} | "
              f"{100 * max(r['d_train'], r['d_test']):.2f}% | {auc} |")


if __name__ == "__main__":
    main()
