// Package sgemm holds the micro-kernels and packing routines of nn's
// deterministic GEMM (nn/gemm.go has the driver and the arithmetic it
// promises). They were put here, not in nn, when nn used cgo with the
// openblas tag (a package that uses cgo cannot hold Go assembly); nn's cgo
// now lives in nn/internal/openblas.
//
// # Arithmetic
//
// A kernel computes an MR × NR tile of C over kc values of l:
//
//	c_rj = c_rj + q[l·ql + j]·p[l·pl + r·pr]     for l = 0, 1, ..., kc-1
//
// the product rounded to float32, then the sum: no fused multiply-add, no
// sum across lanes, l ascending. A NaN product wins over a NaN c (the
// first-source rule of SSE's ADDPS, whose order the amd64 kernels keep).
// The SIMD lanes hold different columns j, so every kernel, the Go one
// included, gives the same bits. q is a packed panel (ql = NR) or B itself,
// read in place with its row stride.
//
// # Kernels
//
// [Kernels] lists those the CPU runs, asked at run time: [AVX512] (8×32,
// and 8×16 for narrow panels, amd64 with AVX-512F), [AVX2] (6×16, amd64
// with AVX2), [NEON] (8×8, every arm64) and [Go] (4×16, any CPU; also what
// the purego build tag leaves).
//
// # Concurrency
//
// Kernels keep no state; any number may run at once on disjoint tiles.
package sgemm

import (
	"math"
	"unsafe"
)

// Kernel is a micro-kernel and the packing routine for its panel width.
type Kernel struct {
	Name   string
	MR, NR int
	// Tile computes a tile of C (row r at c[r·ldc]) from the scalars
	// p[l·pl + r·pr] (r < MR) and the panel q[l·ql + j] (j < NR). It
	// starts from C (flags&Load), multiplied by beta (flags&Scale), or from
	// zero. It returns true, having written nothing, if a value of C it
	// loads is -0 or a signalling NaN, or if a value it would store is an
	// infinity or a NaN: the caller then computes the tile with the chain,
	// which skips the products of a zero s (gemm.go says why).
	Tile func(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)
	// Strided is whether Tile takes any pl and pr; if not, p must be
	// packed: pl = MR, pr = 1.
	Strided bool
	// PackT packs NR columns of a transposed B: dst[l·NR + j] = src[j·lds + l].
	PackT func(kc int, src []float32, lds int, dst []float32)
	// Narrow, if not nil, is a kernel with the same MR and Strided for
	// panels of at most NR/2 columns, which this kernel would pad.
	Narrow *Kernel
}

// Flags of Kernel.Tile.
const (
	Load  = 1 // start from C, not zero
	Scale = 2 // multiply the loaded C by beta
)

// Kernels lists the kernels this CPU runs, best first; the last is Go.
func Kernels() []*Kernel { return append(cpuKernels(), Go) }

// Go is the kernel in Go, for any CPU.
var Go = &Kernel{Name: "go", MR: 4, NR: 16, Tile: tileGo(4, 16), Strided: true, PackT: packTGo(16)}

// special reports whether v is -0 or a signalling NaN: the values for
// which v + 0 does not have v's bits.
func special(v float32) bool {
	b := math.Float32bits(v)
	return b == 0x80000000 || b&0x7fc00000 == 0x7f800000 && b&0x003fffff != 0
}

// tileGo is Tile in Go. The float32 conversion of each product forbids the
// compiler to fuse it with the add (Go fuses x*y+z on arm64 otherwise).
func tileGo(mr, nr int) func(int, *float32, int, int, *float32, int, *float32, int, float32, int) bool {
	return func(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) bool {
		ps := unsafe.Slice(p, (kc-1)*pl+(mr-1)*pr+1)
		qs := unsafe.Slice(q, max(0, (kc-1)*ql+nr))
		cs := unsafe.Slice(c, (mr-1)*ldc+nr)
		var accBuf [8 * 32]float32
		acc := accBuf[:mr*nr]
		if flags&Load != 0 {
			for r := 0; r < mr; r++ {
				copy(acc[r*nr:(r+1)*nr], cs[r*ldc:])
			}
			if flags&Scale != 0 {
				for i := range acc {
					acc[i] *= beta
				}
			}
			for _, v := range acc {
				if special(v) {
					return true
				}
			}
		}
		for l := 0; l < kc; l++ {
			qrow := qs[l*ql : l*ql+nr]
			for r := 0; r < mr; r++ {
				s := ps[l*pl+r*pr]
				a := acc[r*nr : (r+1)*nr]
				for j, bv := range qrow {
					// A NaN product wins (the first source of ADDPS).
					if p := float32(bv * s); p == p {
						a[j] = p + a[j]
					} else {
						a[j] = p
					}
				}
			}
		}
		var bad uint32
		for _, v := range acc {
			bad |= nonFinite(v)
		}
		if bad&0x80000000 != 0 {
			return true
		}
		for r := 0; r < mr; r++ {
			copy(cs[r*ldc:r*ldc+nr], acc[r*nr:])
		}
		return false
	}
}

// nonFinite accumulates, in bit 31, whether a value is an infinity or a NaN.
func nonFinite(v float32) uint32 { return math.Float32bits(v)&0x7f800000 + 0x00800000 }

func packTGo(nr int) func(int, []float32, int, []float32) {
	return func(kc int, src []float32, lds int, dst []float32) {
		for j := 0; j < nr; j++ {
			for l, v := range src[j*lds : j*lds+kc] {
				dst[l*nr+j] = v
			}
		}
	}
}
