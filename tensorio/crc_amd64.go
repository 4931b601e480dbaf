//go:build !purego

package tensorio

// crc32cHybrid updates the raw (not inverted) CRC-32C state crc with the
// blocks*hybridBlock bytes at src, blocks > 0, and copies them to dst as
// mode says (foldHash: no copy; foldCopyNT: dst 64-byte aligned). It
// needs AVX-512F, VPCLMULQDQ and SSE4.2 (hasFold).
//
//go:noescape
func crc32cHybrid(dst, src *byte, blocks int, crc uint32, mode int) uint32

// hasFold reports whether crc32cHybrid can run.
var hasFold = x86.avx512 && x86.vpclmulqdq && x86.pclmulqdq && x86.sse41 && x86.sse42
