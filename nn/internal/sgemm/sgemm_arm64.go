//go:build !purego

package sgemm

//go:noescape
func kernel8x8NEON(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)

// NEON is the 8×8 kernel for arm64 (every arm64 CPU has Advanced SIMD):
// sixteen 4-lane accumulators, multiplying by an element of a vector of s
// (FMUL by element) so that no broadcast is needed. It reads p packed.
var NEON = &Kernel{
	Name: "neon", MR: 8, NR: 8,
	Tile:  kernel8x8NEON,
	PackT: packTGo(8),
}

func cpuKernels() []*Kernel { return []*Kernel{NEON} }
