#!/usr/bin/env bash
# Jobs on three `ppnode join` processes in network namespaces with
# shaped links (root, ip and tc needed), logged for BENCHMARKS.md.
#
#   bench/links.sh            # every measurement (about 25 minutes)
#   bench/links.sh Rate|DDP|Codec|SlowNode|Cut|Int8
#
# Rate: 100 Mbit/s against unshaped links; DDP: PyTorch DDP (gloo,
# bench/ddp_gloo.py) on the same links; Codec: automatic codecs against raw
# frames at 100 Mbit/s; SlowNode: one node behind 20 Mbit/s, link-aware
# against link-blind plans; Cut: a link slowed from 1 Gbit/s to 50 Mbit/s
# mid-job; Int8: --wire int8 against lossless for one epoch.
set -euo pipefail
cd "$(dirname "$0")/.."
tags=()
# (grep reads all: with pipefail, grep -q's early exit fails ldconfig's write)
if { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep 'libopenblas\.so ' >/dev/null; then
	tags=(-tags openblas)
	export CGO_LDFLAGS=-lopenblas
fi
PPNODE_LINKS=1 exec go test "${tags[@]}" -count=1 -timeout 60m -run "^TestLinks${1:-}" -v ./integration
