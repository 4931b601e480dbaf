"""How long a job's end takes: two one-thread nodes on 127.0.0.1, one job
(TRAIN FLAGS), and the times at which the coordinator's node first reports
each state of it (starting, training, evaluating, done), polled every 50 ms:
the time from evaluating to done is the final test-set evaluation (on the
stages, or on the coordinator's node alone in builds before the stages
evaluated); and how its progress showed in the status (`evaluation`:
samples done of the test split).

Run (after `make build`; BIN=path picks another build):
  /usr/bin/python3 bench/eval_time.py TRAIN FLAGS...
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_waits import api, submit, two_nodes  # noqa: E402


def main():
    with two_nodes() as (http, _):
        pr, box = submit(http, sys.argv[1:])
        states, news = [], []  # news: (time, samples done, samples) of the evaluation
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
            e = st.get("evaluation")
            if e and (not news or news[-1][1] != e["done"]):
                news.append((time.time(), e["done"], e["samples"]))
        res = json.loads(pr.communicate()[0].splitlines()[-1])
        t0 = states[0][1] if states else 0
        print("states (first seen, s after the first; step):", [(s, round(t - t0, 2), step) for s, t, step in states])
        if news:
            print(f"evaluation in the status: {len(news)} updates, from {news[0][1]}/{news[0][2]} samples at "
                  f"{news[0][0] - t0:.2f} s to {news[-1][1]}/{news[-1][2]} at {news[-1][0] - t0:.2f} s")
        print(f"step {res['measured_step_ms']:.1f} ms, test accuracy {res.get('test_accuracy')}, "
              f"evaluated in {res.get('eval_seconds', '?')} s on the {res.get('evaluated_on', '?')}")


if __name__ == "__main__":
    main()
