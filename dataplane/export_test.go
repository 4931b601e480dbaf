package dataplane

// For the benchmark that compares the data plane with the actors
// (transport_test.go, package dataplane_test: it imports actors).
var (
	Pair       = pair
	RawTCPPair = rawTCPPair
	CPUSeconds = cpuSeconds
)

const BenchElems = benchElems
