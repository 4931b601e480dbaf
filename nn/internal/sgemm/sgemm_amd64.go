//go:build !purego

package sgemm

import "golang.org/x/sys/cpu"

//go:noescape
func kernel6x16AVX2(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)

//go:noescape
func kernel8x32AVX512(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)

//go:noescape
func kernel8x16AVX512(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)

//go:noescape
func packT8(kc8 int, src *float32, lds int, dst *float32, ldd int)

// x86 holds the CPU features the kernels need: avx2 with the OS saving the
// YMM state, avx512 (F) with the OS saving the ZMM state.
var x86 = struct{ avx2, avx512 bool }{
	avx2:   cpu.X86.HasAVX2,
	avx512: cpu.X86.HasAVX2 && cpu.X86.HasAVX512F,
}

// AVX2 is the 6×16 kernel for AVX2: twelve YMM accumulators.
var AVX2 = &Kernel{
	Name: "avx2", MR: 6, NR: 16,
	Tile:    kernel6x16AVX2,
	Strided: true,
	PackT:   packTAVX2(16),
}

// AVX512 is the 8×32 kernel for AVX-512F: sixteen ZMM accumulators, s
// broadcast from memory into the multiply. Half the instructions of AVX2's
// for the same work: 30-40% faster on AMD Zen 4, whose 512-bit operations
// take its 256-bit pipes twice. Panels of up to 16 columns (a layer of 16
// channels) go to an 8×16 kernel, which wastes no lanes on padding.
var AVX512 = &Kernel{
	Name: "avx512", MR: 8, NR: 32,
	Tile:    kernel8x32AVX512,
	Strided: true,
	PackT:   packTAVX2(32),
	Narrow: &Kernel{
		Name: "avx512-narrow", MR: 8, NR: 16,
		Tile:    kernel8x16AVX512,
		Strided: true,
		PackT:   packTAVX2(16),
	},
}

func cpuKernels() []*Kernel {
	var ks []*Kernel
	if x86.avx512 {
		ks = append(ks, AVX512)
	}
	if x86.avx2 {
		ks = append(ks, AVX2)
	}
	return ks
}

func packTAVX2(nr int) func(int, []float32, int, []float32) {
	tail := packTGo(nr)
	return func(kc int, src []float32, lds int, dst []float32) {
		if kc == 0 {
			return
		}
		_ = src[(nr-1)*lds+kc-1]
		_ = dst[kc*nr-1]
		kc8 := kc / 8
		if kc8 > 0 {
			for r := 0; r < nr; r += 8 {
				packT8(kc8, &src[r*lds], lds, &dst[r], nr)
			}
		}
		if l := kc8 * 8; l < kc {
			tail(kc-l, src[l:], lds, dst[l*nr:])
		}
	}
}
