#!/usr/bin/env bash
# What --deterministic costs: the default backend
# and the deterministic one on the same model, run alternately; prints
# samples/s and the median step (ms) of each run.
# Usage: bench/deterministic_cost.sh [rounds] [binary]   (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
bin=${2:-bin/ppnode}
common=(--threads 2 --micro-batches 1 --optimizer sgd --json)
for r in $(seq "$rounds"); do
	for mode in default deterministic; do
		flag=()
		[ "$mode" = deterministic ] && flag=(--deterministic)
		for model in "resnet50 --width 0.25 --data synthetic:32x32x3:10 --synthetic-samples 512 --batch 32 --steps 10" \
			"mlp32 --width 512 --data mnist --batch 128 --steps 100"; do
			# shellcheck disable=SC2086
			flock /tmp/ppnode-bench.lock "$bin" train --local --model $model "${common[@]}" "${flag[@]}" 2>/dev/null |
				tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); print('${model%% *}', '$mode', r['backend'], round(r['samples_per_sec'], 1), round(r['measured_step_ms'], 1))"
		done
	done
done
