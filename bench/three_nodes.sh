#!/usr/bin/env bash
# A job on three `ppnode join` processes on 127.0.0.1, printed as
# the result's weights_sha256 and throughput, for comparing two builds of
# ppnode side by side (before and after a change).
#
#   bench/three_nodes.sh BINARY PORT sha    # mlp32 width 128 on MNIST, 60 deterministic
#                                           # steps: --local and 3 nodes (--via)
#   bench/three_nodes.sh BINARY PORT speed  # mlp32 width 64, batch 32, M=4, 800 small
#                                           # steps: samples/s and the median step
#   bench/three_nodes.sh BINARY PORT crossarch  # integration/crossarch's two runs:
#                                           # --local and 3 nodes
#   bench/three_nodes.sh BINARY PORT gpt MODEL DATA  # the README's GPT (300 steps,
#                                           # automatic plan): wall time, training time,
#                                           # test loss and the final evaluation's time
#
# PORT and the nine ports after it must be free (gossip PORT..PORT+2,
# HTTP PORT+10..PORT+12).
set -euo pipefail
bin=$1 port=$2 what=$3
files=()
[ "$what" = gpt ] && files=(--files "$(dirname "$(realpath "$4")")" --files "$(dirname "$(realpath "$5")")")
dir=$(mktemp -d)
pids=()
# The nodes' local token (SECURITY.md), sent by the CLI and by api below.
export PPNODE_TOKEN_FILE="$dir/http-token"
api() { curl -sf -H "Authorization: Bearer $(cat "$PPNODE_TOKEN_FILE" 2>/dev/null)" "$@"; }
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
start() { # name index [seed]
	local seeds=()
	[ "$2" -gt 0 ] && seeds=(--seeds "127.0.0.1:$port")
	"$bin" join --name "$1" --bind "127.0.0.1:$((port + $2))" --http "127.0.0.1:$((port + 10 + $2))" \
		--threads 1 --data-dir "$dir/$1" "${seeds[@]}" "${files[@]}" >"$dir/$1.log" 2>&1 &
	pids+=($!)
}
start a 0
for i in $(seq 50); do api "127.0.0.1:$((port + 10))/v1/status" >/dev/null && break; sleep 0.1; done
start b 1
start c 2
for i in $(seq 100); do
	n=$(api "127.0.0.1:$((port + 10))/v1/status" | python3 -c 'import json,sys; print(sum(m["state"]=="alive" for m in json.load(sys.stdin)["members"]))' || echo 0)
	[ "$n" = 3 ] && break
	sleep 0.1
done
via=(--via "127.0.0.1:$((port + 10))" --partition uniform --schedule 1f1b)
case $what in
sha)
	args=(--deterministic --model mlp32 --width 128 --data mnist --batch 64 --micro-batches 4 --steps 60 --threads 1 --json)
	echo "local $("$bin" train --local "${args[@]}" 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["weights_sha256"])')"
	echo "via   $("$bin" train "${via[@]}" "${args[@]}" 2>/dev/null | tail -1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["weights_sha256"], d["plan"])')"
	;;
speed)
	args=(--deterministic --model mlp32 --width 64 --data synthetic:8x8x1:4 --synthetic-samples 4096 --batch 32
		--micro-batches 4 --epochs 100 --steps 800 --threads 1 --checkpoint-every 100 --json)
	"$bin" train "${via[@]}" "${args[@]}" 2>/dev/null | tail -1 |
		python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f samples/s, median step %.2f ms" % (d["samples_per_sec"], d["measured_step_ms"]))'
	;;
crossarch)
	for flags in "--model mlp32 --width 64 --data synthetic:28x28x1:10 --synthetic-samples 512 --steps 20" \
		"--model resnet50 --width 0.25 --data synthetic:32x32x3:10 --synthetic-samples 64 --batch 16 --steps 5"; do
		# shellcheck disable=SC2206
		args=(--deterministic $flags --json)
		echo "${flags%% --width*}"
		echo "  local $("$bin" train --local "${args[@]}" 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["weights_sha256"][:16])')"
		echo "  via   $("$bin" train "${via[@]}" "${args[@]}" 2>/dev/null | tail -1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["weights_sha256"][:16], d["plan"])')"
	done
	;;
gpt)
	t0=$(date +%s.%N)
	"$bin" train --via "127.0.0.1:$((port + 10))" --model "$(realpath "$4")" --data "$(realpath "$5")" --steps 300 --batch 16 \
		--micro-batches 4 --optimizer adam --json 2>/dev/null | tail -1 |
		python3 -c 'import json,sys,time; d=json.load(sys.stdin); print("wall %.1f s: trained %.1f s, %.1f samples/s, test loss %.6f, evaluated in %s s on the %s; plan %s" % (time.time() - float(sys.argv[1]), d["seconds"], d["samples_per_sec"], d["test_loss"], d.get("eval_seconds", "?"), d.get("evaluated_on", "?"), d["plan"]))' \
			"$t0"
	;;
*)
	echo "usage: $0 BINARY PORT sha|speed|crossarch|gpt" >&2
	exit 2
	;;
esac
