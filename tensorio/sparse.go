package tensorio

import (
	"encoding/binary"
	"math"
	"math/bits"
	"unsafe"
)

// The sparse codec stores a bitmap with one bit per element (bit i%8 of
// byte i/8 is set when element i is not +0.0) followed by the non-zero
// elements, little-endian, in order:
//
//	+-------------------------+------------------------------+
//	| bitmap: ceil(n/8) bytes | values: 4 x popcount(bitmap) |
//	+-------------------------+------------------------------+
//
// Only the bit pattern 0x00000000 counts as zero, so -0.0 and NaNs survive
// bit for bit.
//
// Both directions work on blocks of 64 elements (one bitmap word) and are
// branch-free inside a block: every element is stored and the output
// position advances only past the non-zero ones. On amd64 with AVX-512
// (VBMI) the assembly kernels of sparse_amd64.s do the blocks with
// compress and expand instructions, 16 elements at a time, at about 40
// GB/s; on other little-endian machines the block loops use unaligned
// 32-bit loads and stores through unsafe pointers, inside bounds
// established by a checked slice expression per block; elsewhere the
// portable versions run.

// useSparseAVX selects the assembly kernels where they can run; tests turn
// it off to exercise the Go block loops.
var useSparseAVX = hasSparseAVX

// bitmapLen is the size of the bitmap for n elements.
func bitmapLen(n int) int { return (n + 7) / 8 }

// sparseMaxLen bounds the sparse encoding of n elements.
func sparseMaxLen(n int) int { return bitmapLen(n) + 4*n }

// b2u is 1 for true and 0 for false, compiled without a branch.
func b2u(b bool) uint {
	var x uint
	if b {
		x = 1
	}
	return x
}

// sparseEncode writes the sparse encoding of src into dst, which must have
// length at least sparseMaxLen(len(src)), and returns the encoded length.
func sparseEncode(dst []byte, src []float32) int {
	if nativeLE {
		return sparseEncodeLE(dst, src)
	}
	return sparseEncodePortable(dst, src)
}

func sparseEncodeLE(dst []byte, src []float32) int {
	n := len(src)
	bm := dst[:bitmapLen(n)]
	vals := dst[len(bm) : len(bm)+4*n]
	c := 0 // bytes of vals written; c <= 4*i at element i
	i := 0
	if useSparseAVX && n >= 64 {
		// Its stores stay inside vals: c <= 4*i.
		c = sparseEncodeAVX(&bm[0], &vals[0], &src[0], n/64)
		i = n &^ 63
	}
	for ; i+64 <= n; i += 64 {
		blk := (*[64]uint32)(unsafe.Pointer((*[64]float32)(src[i : i+64])))
		// c <= 4*i, so out has at least 256 bytes and every store below
		// (at offset o <= 252) is inside it.
		out := vals[c : 4*(i+64)]
		p := unsafe.Pointer(unsafe.SliceData(out))
		o := uintptr(0)
		var w uint64
		for _, b := range blk {
			*(*uint32)(unsafe.Add(p, o)) = b
			nz := b2u(b != 0)
			o += uintptr(4 * nz)
			w = w>>1 | uint64(nz)<<63
		}
		binary.LittleEndian.PutUint64(bm[i/8:], w)
		c += int(o)
	}
	return len(bm) + sparseEncodeTail(bm, vals, c, src, i)
}

func sparseEncodePortable(dst []byte, src []float32) int {
	n := len(src)
	bm := dst[:bitmapLen(n)]
	vals := dst[len(bm) : len(bm)+4*n]
	c := 0
	i := 0
	for ; i+64 <= n; i += 64 {
		blk := (*[64]float32)(src[i : i+64])
		out := vals[c : 4*(i+64)]
		o := 0
		var w uint64
		for _, x := range blk {
			b := math.Float32bits(x)
			binary.LittleEndian.PutUint32(out[o:], b)
			nz := b2u(b != 0)
			o += int(4 * nz)
			w = w>>1 | uint64(nz)<<63
		}
		binary.LittleEndian.PutUint64(bm[i/8:], w)
		c += o
	}
	return len(bm) + sparseEncodeTail(bm, vals, c, src, i)
}

// sparseEncodeTail encodes src[i:] (fewer than 64 elements) and returns
// the number of value bytes written in total.
func sparseEncodeTail(bm, vals []byte, c int, src []float32, i int) int {
	clear(bm[i/8:])
	for ; i < len(src); i++ {
		b := math.Float32bits(src[i])
		if b != 0 {
			bm[i/8] |= 1 << (i % 8)
			binary.LittleEndian.PutUint32(vals[c:], b)
			c += 4
		}
	}
	return c
}

// sparseCheck verifies that enc is a well-formed sparse encoding of n
// elements: the number of values matches the bitmap's population count and
// no bit is set past element n.
func sparseCheck(enc []byte, n int) error {
	bl := bitmapLen(n)
	if len(enc) < bl || (len(enc)-bl)%4 != 0 {
		return corruptf("sparse payload of %d bytes for %d elements", len(enc), n)
	}
	pop, err := bitmapCount(enc[:bl], n)
	if err != nil {
		return err
	}
	if want := bl + 4*pop; want != len(enc) {
		return corruptf("sparse payload has %d bytes, its bitmap needs %d", len(enc), want)
	}
	return nil
}

// sparseDecode expands enc, which sparseCheck has accepted for len(dst)
// elements, into dst.
func sparseDecode(dst []float32, enc []byte) {
	if nativeLE {
		sparseDecodeLE(dst, enc)
		return
	}
	sparseDecodePortable(dst, enc)
}

func sparseDecodeLE(dst []float32, enc []byte) {
	n := len(dst)
	bl := bitmapLen(n)
	bm := enc[:bl]
	vals := enc[bl:]
	c := 0
	i := 0
	if useSparseAVX && n >= 64 && len(vals) > 0 {
		// It stops before reading past vals; the loop below does the
		// rest.
		done, used := sparseDecodeAVX(&dst[0], &bm[0], &vals[0], n/64, len(vals))
		i, c = 64*done, used
	}
	for ; i+64 <= n; i += 64 {
		w := binary.LittleEndian.Uint64(bm[i/8:])
		out := (*[64]uint32)(unsafe.Pointer((*[64]float32)(dst[i : i+64])))
		switch {
		case w == 0:
			*out = [64]uint32{}
		case w == math.MaxUint64:
			copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), 256), vals[c:c+256])
			c += 256
		case c+256+4 <= len(vals):
			// Load the next value whatever the bit says, keep it
			// (mask) and advance only when the bit is set. The loads
			// stay inside v: o <= 252 before each one.
			v := vals[c : c+256+4]
			p := unsafe.Pointer(unsafe.SliceData(v))
			o := uintptr(0)
			for j := range out {
				bit := uint32(w) & 1
				w >>= 1
				out[j] = *(*uint32)(unsafe.Add(p, o)) & -bit
				o += uintptr(4 * bit)
			}
			c += int(o)
		default:
			c = sparseDecodeWord(out, w, vals, c)
		}
	}
	sparseDecodeTail(dst, bm, vals, c, i)
}

func sparseDecodePortable(dst []float32, enc []byte) {
	n := len(dst)
	bl := bitmapLen(n)
	bm := enc[:bl]
	vals := enc[bl:]
	c := 0
	i := 0
	for ; i+64 <= n; i += 64 {
		w := binary.LittleEndian.Uint64(bm[i/8:])
		out := (*[64]float32)(dst[i : i+64])
		if c+256+4 <= len(vals) {
			v := vals[c : c+256+4]
			o := 0
			for j := range out {
				bit := uint32(w) & 1
				w >>= 1
				out[j] = math.Float32frombits(binary.LittleEndian.Uint32(v[o:]) & -bit)
				o += int(4 * bit)
			}
			c += o
			continue
		}
		var u [64]uint32
		c = sparseDecodeWord(&u, w, vals, c)
		for j, x := range u {
			out[j] = math.Float32frombits(x)
		}
	}
	sparseDecodeTail(dst, bm, vals, c, i)
}

// sparseDecodeWord expands one block visiting only the set bits; it is
// used near the end of the values where the branch-free loop would read
// past them.
func sparseDecodeWord(out *[64]uint32, w uint64, vals []byte, c int) int {
	*out = [64]uint32{}
	for w != 0 {
		j := bits.TrailingZeros64(w)
		out[j] = binary.LittleEndian.Uint32(vals[c:])
		c += 4
		w &= w - 1
	}
	return c
}

func sparseDecodeTail(dst []float32, bm, vals []byte, c, i int) {
	for ; i < len(dst); i++ {
		if bm[i/8]>>(i%8)&1 != 0 {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(vals[c:]))
			c += 4
		} else {
			dst[i] = 0
		}
	}
}
