//go:build !amd64 || purego

package tensorio

const hasSparseAVX = false

func sparseEncodeAVX(bm, vals *byte, src *float32, blocks int) int { panic("unreachable") }

func sparseDecodeAVX(dst *float32, bm, vals *byte, blocks, valsLen int) (int, int) {
	panic("unreachable")
}

func sparseSplitAVX(bm, top, low *byte, src *float32, blocks int) int { panic("unreachable") }

func sparseJoinAVX(dst *float32, bm, top, low *byte, blocks, topLen, lowLen int) (int, int) {
	panic("unreachable")
}
