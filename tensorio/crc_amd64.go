//go:build !purego

package tensorio

// crc32cFold updates the raw (not inverted) CRC-32C state crc with the n
// bytes at src, n a positive multiple of 256, and copies them to dst as
// mode says (foldCopyNT: non-temporal stores, dst 64-byte aligned). It
// needs AVX-512F and VPCLMULQDQ (hasFold).
//
//go:noescape
func crc32cFold(dst, src *byte, n int, crc uint32, mode int) uint32

// crc32cHybrid updates the raw CRC-32C state crc with the
// blocks*hybridBlock bytes at src, blocks > 0. It needs AVX-512F,
// VPCLMULQDQ and SSE4.2 (hasFold).
//
//go:noescape
func crc32cHybrid(src *byte, blocks int, crc uint32) uint32

// hasFold reports whether crc32cFold and crc32cHybrid can run.
var hasFold = x86.avx512 && x86.vpclmulqdq && x86.pclmulqdq && x86.sse41 && x86.sse42
