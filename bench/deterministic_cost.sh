#!/usr/bin/env bash
# What --deterministic costs: samples/s of the default backend and of the
# deterministic (pure-Go) one on the same model, run alternately.
# Usage: bench/deterministic_cost.sh [rounds] [steps]   (after `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-30}
for model in "mlp32 --data mnist" "resnet50 --width 0.25 --data synthetic:32x32x3:10 --synthetic-samples 512"; do
	for r in $(seq "$rounds"); do
		for mode in default deterministic; do
			flag=""
			[ "$mode" = deterministic ] && flag=--deterministic
			s=$([ "${model%% *}" = resnet50 ] && echo $((steps / 5)) || echo "$steps")
			bin/ppnode train --local --json --steps "$s" --model $model $flag |
				tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); print('${model%% *}', '$mode', r['backend'], round(r['samples_per_sec'],1))"
		done
	done
done
