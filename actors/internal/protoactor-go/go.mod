// A trimmed, patched copy of github.com/asynkron/protoactor-go
// v0.0.0-20240822202345-3c0e61ca19c9 (only the packages ppnode uses; see
// PATCHES.md). ppnode's go.mod replaces the upstream module with it.
module github.com/asynkron/protoactor-go

go 1.21

require (
	github.com/Workiva/go-datastructures v1.1.3
	github.com/asynkron/gofun v0.0.0-20220329210725-34fed760f4c2
	github.com/emirpasic/gods v1.18.1
	github.com/gogo/protobuf v1.3.2
	github.com/lithammer/shortuuid/v4 v4.0.0
	github.com/lmittmann/tint v1.0.3
	github.com/orcaman/concurrent-map v1.0.0
	github.com/prometheus/client_golang v1.17.0
	github.com/twmb/murmur3 v1.1.8
	go.opentelemetry.io/otel v1.21.0
	go.opentelemetry.io/otel/exporters/prometheus v0.44.0
	go.opentelemetry.io/otel/metric v1.21.0
	go.opentelemetry.io/otel/sdk/metric v1.21.0
	golang.org/x/exp v0.0.0-20231110203233-9a3e6036ecaa
	golang.org/x/net v0.21.0
	google.golang.org/grpc v1.60.1
	google.golang.org/protobuf v1.33.0
)
