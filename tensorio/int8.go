package tensorio

import (
	"encoding/binary"
	"math"
)

// int8Block is the number of values that share one scale in CodecInt8.
const int8Block = 64

// int8NaN is the code of a non-finite value; finite values use -127..127.
const int8NaN = -128

func int8Blocks(n int) int { return (n + int8Block - 1) / int8Block }

// int8Len is the payload length of n values: one float32 scale per block,
// then one byte per value.
func int8Len(n int) int { return 4*int8Blocks(n) + n }

// int8Encode quantizes src into dst (int8Len bytes): each block of
// int8Block values is stored as q = round(x/scale) with scale its largest
// finite magnitude over 127, so the error of a value is at most half its
// block's scale. Non-finite values are coded int8NaN and decode as NaN.
func int8Encode(dst []byte, src []float32) {
	nb := int8Blocks(len(src))
	scales, codes := dst[:4*nb], dst[4*nb:4*nb+len(src)]
	for b := range nb {
		blk := src[b*int8Block : min((b+1)*int8Block, len(src))]
		var amax float32
		for _, x := range blk {
			if a := float32(math.Abs(float64(x))); a > amax && a <= math.MaxFloat32 {
				amax = a
			}
		}
		scale := amax / 127
		if 127*scale > math.MaxFloat32 { // would decode as Inf
			scale = math.Nextafter32(scale, 0)
		}
		binary.LittleEndian.PutUint32(scales[4*b:], math.Float32bits(scale))
		inv := 0.0 // float64: 127/amax overflows float32 for tiny amax
		if amax > 0 {
			inv = 127 / float64(amax)
		}
		q := codes[b*int8Block:]
		for i, x := range blk {
			q[i] = byte(int8Code(x, inv))
		}
	}
}

// int8Code quantizes x in a block whose largest finite magnitude is
// 127/inv.
func int8Code(x float32, inv float64) int8 {
	if x-x != 0 { // NaN or Inf
		return int8NaN
	}
	v := float32(float64(x) * inv)
	if v >= 0 {
		return int8(min(v+0.5, 127))
	}
	return int8(max(v-0.5, -127))
}

// int8Decode inverts int8Encode. A scale that is negative or not finite
// is corrupt.
func int8Decode(dst []float32, src []byte) error {
	nb := int8Blocks(len(dst))
	scales, codes := src[:4*nb], src[4*nb:]
	for b := range nb {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*b:]))
		if !(scale >= 0 && 127*scale <= math.MaxFloat32) {
			return corruptf("int8 block %d has scale %v", b, scale)
		}
		lo := b * int8Block
		out := dst[lo:min(lo+int8Block, len(dst))]
		for i := range out {
			q := int8(codes[lo+i])
			if q == int8NaN {
				out[i] = float32(math.NaN())
				continue
			}
			out[i] = float32(q) * scale
		}
	}
	return nil
}
