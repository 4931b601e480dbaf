#!/usr/bin/env bash
# Go benchmark A/B: runs one benchmark of several test binaries in turn
# (A B A B ...), each under the benchmark lock, and prints each binary's
# median ns/op in ms with its runs. Build the binaries from the trees to
# compare, e.g. `go test -c -tags 'openblas dnnl' -o /tmp/nn-a.test ./nn`.
# Usage: bench/ab.sh ROUNDS BENCH BENCHTIME BINARY...
#   bench/ab.sh 5 'ConvNetStepDeterministic/resnet50/micro=1/threads=2' 8x /tmp/nn-a.test /tmp/nn-b.test
set -euo pipefail
rounds=$1 bench=$2 benchtime=$3
shift 3
dir=$(cd "$(dirname "$0")/../nn" && pwd)
for r in $(seq "$rounds"); do
	for b in "$@"; do
		ms=$(cd "$dir" && flock /tmp/ppnode-bench.lock "$b" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" |
			awk '/ns\/op/ {print $3 / 1e6; exit}')
		echo "$b $ms"
	done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    b, ms = line.split()
    runs.setdefault(b, []).append(float(ms))
for b, v in runs.items():
    print(b, "median %.1f ms:" % statistics.median(v), " ".join("%.1f" % x for x in v))
'
