//go:build !purego

package tensorio

import "golang.org/x/sys/cpu"

// x86 holds the CPU features the assembly kernels need. avx512 means
// AVX-512F with the OS saving the AVX-512 state; the others are only set
// with it.
var x86 = func() (f struct{ avx512, bw, vbmi, vpclmulqdq, pclmulqdq, sse41, sse42, popcnt bool }) {
	if !cpu.X86.HasAVX512F {
		return f
	}
	f.avx512 = true
	f.bw = cpu.X86.HasAVX512BW
	f.vbmi = cpu.X86.HasAVX512VBMI
	f.vpclmulqdq = cpu.X86.HasAVX512VPCLMULQDQ
	f.pclmulqdq = cpu.X86.HasPCLMULQDQ
	f.sse41 = cpu.X86.HasSSE41
	f.sse42 = cpu.X86.HasSSE42
	f.popcnt = cpu.X86.HasPOPCNT
	return f
}()
