"""One node's step time against its number of micro-batches.

Starts one `ppnode join` node held to a CPU quota (cgroup v1, as
bench/paper_eval.py does) and trains mlp4 (bench/replicas.py's 4-layer MLP)
and mlp32 on it, batch 256, in 1, 2, 4, 8, 16 and 32 micro-batches, twice
over; prints round, model, M and the median step in ms.

Run as root (after `make build`):
  /usr/bin/python3 bench/micro_sweep.py [quota, default 0.25]
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paper_eval  # noqa: E402
import replicas  # noqa: E402
from paper_eval import Node, wait_members  # noqa: E402


def main():
    q = float(sys.argv[1]) if len(sys.argv) > 1 else 0.25
    d = tempfile.mkdtemp(prefix="ppnode-bench-sweep-")
    flags = {"mlp4": replicas.mlp4_files(d), "mlp32": ["--model", "mlp32", "--data", "mnist"]}
    n = Node("a", q)
    try:
        http = n.info["http"]
        wait_members(http, 1)
        for rnd in range(2):
            for model in ["mlp4", "mlp32"]:
                for m in [1, 2, 4, 8, 16, 32]:
                    r = replicas.train(paper_eval.PPNODE, http, flags[model], 12 if model == "mlp4" else 6, m, 1)
                    print(rnd + 1, model, m, round(r["measured_step_ms"], 1), flush=True)
    finally:
        n.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
