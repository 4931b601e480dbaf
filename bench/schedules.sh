#!/usr/bin/env bash
# One pipelined job on NODES (default 3) `ppnode join` processes on
# 127.0.0.1 (one thread each), printed as its plan, the simulator's step time and bubble,
# and the measured ones: the median step of the run, and the median over
# the last 8 steps of 1 - sum(stage busy) / (nodes x step wall time).
# The coordinator plans with node speeds it measures under whatever else
# the machine runs.
#
#   bench/schedules.sh BINARY PORT MEMORY [train flags...]
#
# MEMORY is each node's `join --memory` (none: the machine's); with MEMCG=1,
# each node's cgroup v1 memory limit instead (root; MEMORY in bytes or with
# a K, M or G suffix); with MEMCG=observe, `join --memory` and a cgroup of
# its own without a limit, to report each node's peak. PIN=1 holds node
# i to CPU i mod nproc (taskset), one core per node as on separate
# machines: unpinned, the kernel at times runs two nodes' compute on one
# core while the other idles. CPU=F holds each node to F of a CPU (a
# cgroup v1 CFS quota of F x PERIOD_US, default 100000, per period; root).
# KEEP=1 keeps the nodes' logs; FILES=DIR lets the nodes read model and
# data files there (`join --files`). PORT and the ports up to PORT+19 must be free (gossip
# PORT.., HTTP PORT+10..).
set -euo pipefail
bin=$1 port=$2 mem=$3 nodes=${NODES:-3}
shift 3
dir=$(mktemp -d)
pids=()
# The nodes' local token (SECURITY.md), sent by the CLI and by api below.
export PPNODE_TOKEN_FILE="$dir/http-token"
api() { curl -sf -H "Authorization: Bearer $(cat "$PPNODE_TOKEN_FILE" 2>/dev/null)" "$@"; }
cgs=() cpucgs=()
cleanup() {
	kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	for cg in "${cgs[@]}"; do
		echo "$(basename "$cg"): peak $(($(cat "$cg/memory.max_usage_in_bytes") >> 20)) MiB, OOM kills $(awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control")" >&2
		rmdir "$cg" 2>/dev/null || true
	done
	for cg in "${cpucgs[@]}"; do rmdir "$cg" 2>/dev/null || true; done
	if [ -n "${KEEP:-}" ]; then echo "logs in $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
memflag=()
[ -n "${FILES:-}" ] && memflag+=(--files "$FILES")
[ "$mem" != none ] && [ "${MEMCG:-observe}" = observe ] && memflag+=(--memory "$mem")
# memcg NAME: makes a memory cgroup limited to $mem and prints the command
# prefix that runs a process in it.
memcg() {
	local cg=/sys/fs/cgroup/memory/ppnode-sched-$$-$1 m=${mem%B}
	mkdir -p "$cg"
	[ "$MEMCG" = observe ] || numfmt --from=iec "${m%i}" >"$cg/memory.limit_in_bytes"
	echo "$cg"
}
start() { # name index
	local seeds=()
	[ "$2" -gt 0 ] && seeds=(--seeds "127.0.0.1:$port")
	local run=() into=()
	if [ -n "${MEMCG:-}" ] && [ "$mem" != none ]; then
		local cg
		cg=$(memcg "$1")
		cgs+=("$cg")
		into+=("$cg")
	fi
	if [ -n "${CPU:-}" ]; then
		local cg=/sys/fs/cgroup/cpu/ppnode-sched-$$-$1 period=${PERIOD_US:-100000}
		mkdir -p "$cg"
		cpucgs+=("$cg")
		echo "$period" >"$cg/cpu.cfs_period_us"
		awk -v f="$CPU" -v p="$period" 'BEGIN { printf "%d\n", f * p }' >"$cg/cpu.cfs_quota_us"
		into+=("$cg")
	fi
	# The child moves itself into the cgroups before exec.
	[ ${#into[@]} -gt 0 ] && run=(sh -c 'for cg in $0; do echo $$ > "$cg/cgroup.procs"; done && exec "$@"' "${into[*]}")
	[ -n "${PIN:-}" ] && run+=(taskset -c "$(($2 % $(nproc)))")
	"${run[@]}" "$bin" join --name "$1" --bind "127.0.0.1:$((port + $2))" --http "127.0.0.1:$((port + 10 + $2))" \
		--threads 1 --data-dir none "${memflag[@]}" "${seeds[@]}" >"$dir/$1.log" 2>&1 &
	pids+=($!)
}
start a 0
for i in $(seq 100); do api "127.0.0.1:$((port + 10))/v1/status" >/dev/null && break; sleep 0.1; done
names=(a b c d e f g h)
for i in $(seq 1 $((nodes - 1))); do start "${names[$i]}" "$i"; done
for i in $(seq 200); do
	n=$(api "127.0.0.1:$((port + 10))/v1/status" | python3 -c 'import json,sys; print(sum(m["state"]=="alive" for m in json.load(sys.stdin)["members"]))' || echo 0)
	[ "$n" = "$nodes" ] && break
	sleep 0.1
done
if ! "$bin" train --via "127.0.0.1:$((port + 10))" --json "$@" >"$dir/out" 2>"$dir/err"; then
	grep -v "^run .ppnode" "$dir/err" | tail -2
	exit 1
fi
id=$(tail -1 "$dir/out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
api "127.0.0.1:$((port + 10))/v1/jobs/$id" >"$dir/status"
python3 - "$dir/out" "$dir/status" <<'PY'
import json, statistics, sys
res = json.loads(open(sys.argv[1]).read().splitlines()[-1])
st = json.load(open(sys.argv[2]))
bub = []
for s in st.get("last_steps", []):
    busy = sum(x["forward_ms"] + x["backward_ms"] + x["update_ms"] for x in s["stages"])
    # Per node: an interleaved node's chunks share its time.
    nodes = len({x["node"] for x in st["stages"]}) or len(s["stages"])
    bub.append(1 - busy / (nodes * s["wall_ms"]))
# Per node, its stages' measured compute (median over the last steps) over
# the simulated: how much of a missed step is the passes' speed.
node_of = [x["node"] for x in st.get("stages", [])]
pred_busy, meas_busy = {}, {}
for k, ps in enumerate(st.get("predicted_passes") or []):
    if k < len(node_of):
        pred_busy[node_of[k]] = pred_busy.get(node_of[k], 0) + sum(p["ms"] for p in ps)
for s in st.get("last_steps", []):
    per = {}
    for k, x in enumerate(s["stages"]):
        if k < len(node_of):
            per[node_of[k]] = per.get(node_of[k], 0) + x["forward_ms"] + x["backward_ms"] + x["update_ms"]
    for n, v in per.items():
        meas_busy.setdefault(n, []).append(v)
rec = [("s%d" % s["id"]) for s in st.get("stages", []) if s.get("recompute")]
print("plan %s (%s, M=%d), recomputing: %s" % (res["plan"], res["schedule"], res["micro_batches"], ", ".join(rec) or "none"))
print("step: predicted %.1f ms, measured %.1f ms (x%.2f); bubble: predicted %.1f%%, measured %.1f%%; %.1f samples/s"
      % (res["predicted_step_ms"], res["measured_step_ms"], res["measured_step_ms"] / res["predicted_step_ms"],
         100 * st.get("predicted_bubble", 0), 100 * statistics.median(bub) if bub else float("nan"), res["samples_per_sec"]))
if pred_busy and meas_busy:
    print("compute measured / predicted: " + ", ".join("%s x%.2f" % (n, statistics.median(meas_busy[n]) / pred_busy[n])
                                                     for n in sorted(pred_busy) if n in meas_busy and pred_busy[n] > 0))
PY
# Each node's CPU time and its threads' waits for a CPU over its life
# (/proc/PID/task/*/schedstat: nanoseconds on a CPU, on a run queue).
for k in "${!pids[@]}"; do
	cat /proc/"${pids[$k]}"/task/*/schedstat 2>/dev/null | awk -v n="${names[$k]}" '{ c += $1; w += $2 }
		END { if (c > 0) printf "node %s: %.1f s of CPU, %.1f s waiting for one (%.0f%%)\n", n, c / 1e9, w / 1e9, 100 * w / c }'
done
