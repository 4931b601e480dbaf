"""How long a job's end takes: two one-thread nodes on 127.0.0.1, one job
(TRAIN FLAGS), and the times at which the coordinator's node first reports
each state of it (starting, training, evaluating, done), polled every 50 ms:
the time from evaluating to done is the final test-set evaluation, which
the coordinator runs on its own node.

Run (after `make build`):
  /usr/bin/python3 bench/eval_time.py TRAIN FLAGS...
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import localtoken  # noqa: E402

BIN = os.environ.get("BIN", os.path.join(HERE, "..", "bin", "ppnode"))


def start(d, name, seeds):
    cmd = [BIN, "join", "--name", name, "--bind", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", "1",
           "--data-dir", "none", "--files", tempfile.gettempdir()]
    if seeds:
        cmd += ["--seeds", seeds]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{d}/{name}.log", "w"), text=True)
    for line in p.stdout:
        if line.startswith("ready "):
            return p, json.loads(line[len("ready "):])
    raise SystemExit(f"node {name} did not start")


def api(http, path):
    with localtoken.urlopen(f"http://{http}{path}") as r:
        return json.load(r)


def main():
    d = tempfile.mkdtemp()
    os.environ["PPNODE_TOKEN_FILE"] = d + "/http-token"
    nodes = []
    try:
        pa, ia = start(d, "a", None)
        nodes.append(pa)
        pb, _ = start(d, "b", ia["gossip"])
        nodes.append(pb)
        http = ia["http"]
        while sum(m["state"] == "alive" for m in api(http, "/v1/status")["members"]) < 2:
            time.sleep(0.1)
        pr = subprocess.Popen([BIN, "train", "--via", http, "--json"] + sys.argv[1:], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        box = {}

        def read_id():
            for line in pr.stderr:
                m = re.match(r"job (\S+):", line)
                if m:
                    box["id"] = m.group(1)
        threading.Thread(target=read_id, daemon=True).start()
        states = []
        while pr.poll() is None:
            time.sleep(0.05)
            if "id" not in box:
                continue
            try:
                st = api(http, f"/v1/jobs/{box['id']}")
            except OSError:
                continue
            if not states or states[-1][0] != st["state"]:
                states.append((st["state"], time.time(), st.get("step")))
        res = json.loads(pr.communicate()[0].splitlines()[-1])
        t0 = states[0][1] if states else 0
        print("states (first seen, s after the first; step):", [(s, round(t - t0, 2), step) for s, t, step in states])
        print(f"step {res['measured_step_ms']:.1f} ms, test accuracy {res.get('test_accuracy')}")
    finally:
        for p in nodes:
            p.terminate()
        for p in nodes:
            p.wait()


if __name__ == "__main__":
    main()
