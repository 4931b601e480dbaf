#!/usr/bin/env bash
# Where a training step goes, without and with the oneDNN fast path:
# BenchmarkConvNetStep (resnet50 or vgg16 at width 0.25, 32x32x3, batch 32,
# SGD) built without and with the dnnl tag, profiled with pprof; with perf
# installed, also perf's split between oneDNN's JIT code, Go and the kernel
# (pprof sees C and JIT code only as cgocall).
# Usage: bench/dnnl_profile.sh [model] [micro-batches] [threads] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet50}
micro=${2:-1}
threads=${3:-2}
steps=${4:-20}
out=${PROFILE_DIR:-/tmp/ppnode-profile}
mkdir -p "$out"
bench="ConvNetStep/$model/micro=$micro/threads=$threads\$"
for variant in "before:openblas" "after:openblas dnnl"; do
	name=${variant%%:*}
	tags=${variant#*:}
	go test -tags "$tags" -c -o "$out/nn-$name.test" ./nn
	(cd nn && "$out/nn-$name.test" -test.run '^$' -test.bench "$bench" -test.benchtime "${steps}x" \
		-test.cpuprofile "$out/$name.prof") | grep Benchmark
	go tool pprof -top -nodecount=25 "$out/nn-$name.test" "$out/$name.prof" 2>/dev/null | sed -n '1,35p'
	if command -v perf >/dev/null; then
		(cd nn && perf record -q -o "$out/$name.perf" -F 499 -- "$out/nn-$name.test" -test.run '^$' \
			-test.bench "$bench" -test.benchtime "${steps}x" >/dev/null 2>&1) || true
		perf report -i "$out/$name.perf" --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -6 || true
	fi
done
