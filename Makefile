# ppnode: `make demo` runs the main job, `make test` runs every test.
# OpenBLAS and oneDNN are used when their libraries are installed (Debian:
# libopenblas-dev, libdnnl-dev); otherwise the pure-Go code is built and
# `make deps` says how to get them.

SHELL := /bin/bash
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
BIN := bin/ppnode
# Tests run `go list` and `go mod download`: put this Go first on PATH.
export PATH := $(dir $(GO)):$(PATH)
HAVE_OPENBLAS := $(shell { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -q 'libopenblas\.so ' && echo yes)
# oneDNN (Debian: libdnnl-dev) runs convolutions, pooling and BatchNorm when
# its library and header are installed.
HAVE_DNNL := $(shell { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -q 'libdnnl\.so ' && test -f /usr/include/dnnl.h && echo yes)
ifeq ($(HAVE_OPENBLAS),yes)
  TAG_LIST := openblas
  export CGO_LDFLAGS := -lopenblas
  BACKEND_MSG := GEMM backend: OpenBLAS (libopenblas found)
else
  TAG_LIST :=
  BACKEND_MSG := GEMM backend: pure Go (no libopenblas; run 'make deps' or 'apt-get install libopenblas-dev' for ~8x faster training)
endif
ifeq ($(HAVE_DNNL),yes)
  TAG_LIST += dnnl
  BACKEND_MSG := $(BACKEND_MSG); convolutions: oneDNN (libdnnl found)
else
  BACKEND_MSG := $(BACKEND_MSG); convolutions: pure Go (no libdnnl; 'apt-get install libdnnl-dev' for faster convolutional training)
endif
TAGS := $(if $(strip $(TAG_LIST)),-tags '$(strip $(TAG_LIST))')
# Debian packages the tests and benchmarks use.
DEB_PKGS := libopenblas-dev libdnnl-dev python3-torch python3-torchvision python3-onnx python3-numpy fortunes dataset-fashion-mnist protobuf-compiler iproute2 \
	chromium prometheus qemu-user-static
PREFIX ?= /usr/local

.PHONY: all build demo test test-unit test-integration test-race test-short soak bench deps check-go vet fmt clean cross release install

all: build

check-go:
	@$(GO) version >/dev/null 2>&1 || { echo "Go 1.26 is needed: https://go.dev/doc/install (expected at /usr/local/go)"; exit 1; }

build: check-go
	@echo "$(BACKEND_MSG)"
	$(GO) build $(TAGS) -buildvcs=auto -o $(BIN) ./cmd/ppnode
	@$(MAKE) -s bin/mnist

# MNIST beside the binary, so that a node without Go has it (data.MNISTDir).
bin/mnist:
	@dir=$$(cd /tmp && GOFLAGS= GOWORK=off $(GO) mod download -json $(MNIST_MODULE) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	if [ -n "$$dir" ]; then mkdir -p $@ && cp $$dir/data/*-ubyte.gz $@/ && chmod 644 $@/*; \
	else echo "MNIST not fetched (no module proxy): set PPNODE_MNIST_DIR on the nodes"; fi
MNIST_MODULE := $(shell sed -n 's/^\tMNISTModule = "\(.*\)"$$/\1/p' data/mnist.go)

# Static pure-Go binaries for Linux (no cgo: the pure-Go GEMM), and MNIST
# in bin/mnist/ to copy beside them. -buildvcs=auto: `ppnode version` names
# the commit (GOFLAGS may say otherwise).
release: check-go bin/mnist
	for arch in amd64 arm64; do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -buildvcs=auto -trimpath -ldflags '-s -w' -o bin/ppnode-linux-$$arch ./cmd/ppnode || exit 1; \
	done

# The builds users run besides this one: static Linux amd64 and arm64, and macOS.
cross: check-go
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -o /dev/null ./cmd/ppnode
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -o /dev/null ./cmd/ppnode
	GOOS=darwin GOARCH=arm64 $(GO) build -trimpath -o /dev/null ./cmd/ppnode

install: build
	install -D -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/ppnode
	if [ -d bin/mnist ]; then install -D -m 644 -t $(DESTDIR)$(PREFIX)/share/ppnode/mnist bin/mnist/*; fi
	install -D -m 644 -t $(DESTDIR)$(PREFIX)/share/doc/ppnode README.md SECURITY.md docs/DESIGN.md

# The main job: nodes on loopback (unequal CPU quotas where cgroup v1
# allows) train mlp32 on MNIST as a pipeline; see `$(BIN) demo -h`.
demo: build
	$(BIN) demo

vet: check-go
	$(GO) vet $(TAGS) ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

# The race pass covers the packages that run concurrent code in process.
# It leaves out those whose code starts no goroutine and shares no state
# (job/core is pure; job, data, onnx, nn/zoo, the GEMM kernels, portrange,
# the layering test; integration/crossarch runs nothing with -short) and
# integration, whose nodes are binaries built without the race detector.
RACE_PKGS = $$($(GO) list ./... | grep -Ev '^github.com/ppnode/ppnode(/(integration|integration/crossarch|job|job/core|data|onnx|nn/zoo|nn/internal/sgemm|nn/internal/openblas|portrange))?$$')
# Tests run with -vet=off: `make vet` checks every package and its tests
# with go vet's full set. Test binaries are linked without DWARF (-w: a
# debugger needs it, stack traces do not), which halves their link time.
# -trimpath keeps the clone's directory out of the build cache's keys: a
# fresh clone elsewhere reuses what an earlier one compiled.
TEST_FLAGS := $(TAGS) -count=1 -vet=off -trimpath -ldflags=-w -timeout 12m

# make test: the build, then vet and the cross builds beside the unit
# tests (which leave half the CPUs idle, waiting on timeouts and sockets).
# The integration tests (four at once: they mostly wait) time real
# failures, so nothing else runs beside them; then the race pass. The
# nodes run the binary built first.
test: check-go
	@echo "$(BACKEND_MSG)"
	$(GO) build $(TAGS) -trimpath -o bin/test/ ./...
	@$(MAKE) --no-print-directory -j 3 vet cross test-unit
	@$(MAKE) --no-print-directory TEST_BINARY=$(CURDIR)/bin/test/ppnode test-integration
	@$(MAKE) --no-print-directory test-race

# Every package's tests but integration's.
test-unit: check-go
	$(GO) test $(TEST_FLAGS) -parallel 4 $$($(GO) list ./... | grep -v '/integration$$')

# The nodes run TEST_BINARY, if given.
test-integration: check-go
	$(if $(TEST_BINARY),PPNODE_TEST_BINARY=$(TEST_BINARY) )$(GO) test $(TEST_FLAGS) -parallel 4 ./integration

# GORACE: no 1 s pause as each race binary exits.
test-race: check-go
	GORACE=atexit_sleep_ms=0 $(GO) test $(TEST_FLAGS) -race -short -parallel 4 $(RACE_PKGS)

# The soak (integration TestSoak): faults at random times under jobs run
# back to back for SOAK; samples and the faults' log in soak-out/.
SOAK ?= 1h
soak: build
	PPNODE_TEST_BINARY=$(CURDIR)/$(BIN) $(GO) test $(TAGS) -count=1 -timeout 0 -v -run '^TestSoak$$' ./integration \
		-args -soak $(SOAK) -soak-out $(CURDIR)/soak-out

test-short: check-go
	$(GO) test $(TAGS) -short ./...

# Benchmarks are not tests: figures go to BENCHMARKS.md with their command.
bench: build
	$(BIN) bench gemm
	$(GO) test $(TAGS) -run '^$$' -bench . -benchmem ./nn/ ./tensorio/

# Installs what the tests and benchmarks use (root and apt-get), or says what is missing.
deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PKGS); \
	else \
		echo "Install these Debian packages (as root): apt-get install $(DEB_PKGS)"; \
	fi

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin

# Regenerates the committed protobuf code (needs protoc and protoc-gen-go at
# the google.golang.org/protobuf version in go.mod).
PROTOC_GEN_GO_VERSION = $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc -I actors/proto \
		--go_out=actors --go_opt=paths=source_relative \
		actors/proto/ppnode.proto
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc -I onnx/onnxpb \
		--go_out=onnx/onnxpb --go_opt=paths=source_relative \
		--go_opt=Monnx.proto=github.com/ppnode/ppnode/onnx/onnxpb \
		onnx/onnxpb/onnx.proto
.PHONY: proto
