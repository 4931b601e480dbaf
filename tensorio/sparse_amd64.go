//go:build !purego

package tensorio

// The AVX-512 sparse kernels (sparse_amd64.s). Pointers must be valid for
// the bytes each kernel's comment gives, even when blocks is 0.

//go:noescape
func sparseEncodeAVX(bm, vals *byte, src *float32, blocks int) (valBytes int)

//go:noescape
func sparseDecodeAVX(dst *float32, bm, vals *byte, blocks, valsLen int) (done, valBytes int)

//go:noescape
func sparseSplitAVX(bm, top, low *byte, src *float32, blocks int) (nnz int)

//go:noescape
func sparseJoinAVX(dst *float32, bm, top, low *byte, blocks, topLen, lowLen int) (done, k int)

// hasSparseAVX reports whether the AVX-512 sparse kernels can run: they
// need AVX-512F, BW (byte masks) and VBMI (VPERMB), and POPCNT.
var hasSparseAVX = x86.avx512 && x86.bw && x86.vbmi && x86.popcnt
