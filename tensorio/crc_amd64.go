//go:build !purego

package tensorio

// crc32cFold updates the raw (not inverted) CRC-32C state crc with the n
// bytes at src, n a positive multiple of 256, and copies them to dst as
// mode says (foldHash: no copy; foldCopyNT: dst 64-byte aligned). It needs
// AVX-512F and VPCLMULQDQ (hasFold).
//
//go:noescape
func crc32cFold(dst, src *byte, n int, crc uint32, mode int) uint32

// hasFold reports whether crc32cFold can run.
var hasFold = x86.avx512 && x86.vpclmulqdq && x86.pclmulqdq && x86.sse41
