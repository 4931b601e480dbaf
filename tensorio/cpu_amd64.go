//go:build !purego

package tensorio

func cpuid(leaf, sub uint32) (a, b, c, d uint32)
func xgetbv() (eax uint32)

// x86 holds the CPU features the assembly kernels need. avx512 means
// AVX-512F with the OS saving the AVX-512 state; the others are only set
// with it.
var x86 = func() (f struct{ avx512, bw, vbmi, vpclmulqdq, pclmulqdq, sse41, sse42, popcnt bool }) {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return f
	}
	_, _, c1, _ := cpuid(1, 0)
	const pclmul, sse41, sse42, popcnt, osxsave = 1 << 1, 1 << 19, 1 << 20, 1 << 23, 1 << 27
	// XCR0: SSE, AVX, opmask, upper halves of ZMM0-15, ZMM16-31.
	if c1&osxsave == 0 || xgetbv()&0xe6 != 0xe6 {
		return f
	}
	_, b7, c7, _ := cpuid(7, 0)
	const avx512f, avx512bw = 1 << 16, 1 << 30
	const avx512vbmi, vpclmulqdq = 1 << 1, 1 << 10
	if b7&avx512f == 0 {
		return f
	}
	f.avx512 = true
	f.bw = b7&avx512bw != 0
	f.vbmi = c7&avx512vbmi != 0
	f.vpclmulqdq = c7&vpclmulqdq != 0
	f.pclmulqdq = c1&pclmul != 0
	f.sse41 = c1&sse41 != 0
	f.sse42 = c1&sse42 != 0
	f.popcnt = c1&popcnt != 0
	return f
}()
