package tensorio

import (
	"encoding/binary"
	"errors"
	"math"
	"unsafe"

	"github.com/klauspost/compress/huff0"
)

// The sparse+huff codec splits each non-zero float32 into its top byte
// (sign and the upper seven exponent bits, which take few values in a
// tensor) and its low three bytes (nearly random mantissa bits), and
// Huffman-codes what compresses:
//
//	+-------------------+--------------------+----------------------+
//	| bitmap, as blocks | top bytes, blocks  | low bytes: 3 x nnz   |
//	+-------------------+--------------------+----------------------+
//
// The bitmap is the sparse codec's (ceil(n/8) bytes) and nnz its
// population count. Both it and the nnz top bytes are cut into blocks of
// at most huffBlock bytes, each written as a mode byte and then:
//
//	mode 0, stored:   the block's bytes
//	mode 1, run:      one byte, repeated for the whole block
//	mode 2, huffman:  uint32 length L, then L bytes of a huff0 4-stream
//	                  block with its table

const (
	huffBlock = 1 << 17

	blockStored  = 0
	blockRun     = 1
	blockHuffman = 2
)

// sparseHuffMax bounds the sparse+huff payload of n elements.
func sparseHuffMax(n int) int {
	bl := bitmapLen(n)
	blocks := (bl+huffBlock-1)/huffBlock + (n+huffBlock-1)/huffBlock
	return bl + n + 3*n + blocks
}

// appendBlocks appends src coded in blocks (see above) to dst, which must
// have room for len(src) plus one byte per block.
func appendBlocks(dst, src []byte, hs *huff0.Scratch) []byte {
	for len(src) > 0 {
		blk := src[:min(len(src), huffBlock)]
		src = src[len(blk):]
		hs.Reuse = huff0.ReusePolicyNone
		out, _, err := huff0.Compress4X(blk, hs)
		switch {
		case err == nil && len(out)+5 < len(blk):
			dst = append(dst, blockHuffman)
			dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out)))
			dst = append(dst, out...)
		case errors.Is(err, huff0.ErrUseRLE):
			dst = append(dst, blockRun, blk[0])
		default:
			dst = append(dst, blockStored)
			dst = append(dst, blk...)
		}
	}
	return dst
}

// readBlocks decodes len(dst) bytes of blocks from src into dst and
// returns the rest of src.
func readBlocks(dst, src []byte, hs *huff0.Scratch) ([]byte, error) {
	for len(dst) > 0 {
		blk := dst[:min(len(dst), huffBlock)]
		dst = dst[len(blk):]
		if len(src) == 0 {
			return nil, corruptf("sparse+huff: missing block")
		}
		mode := src[0]
		src = src[1:]
		switch mode {
		case blockStored:
			if len(src) < len(blk) {
				return nil, corruptf("sparse+huff: stored block of %d bytes, %d left", len(blk), len(src))
			}
			copy(blk, src)
			src = src[len(blk):]
		case blockRun:
			if len(src) < 1 {
				return nil, corruptf("sparse+huff: truncated run block")
			}
			for i := range blk {
				blk[i] = src[0]
			}
			src = src[1:]
		case blockHuffman:
			if len(src) < 4 {
				return nil, corruptf("sparse+huff: truncated block length")
			}
			m := int(binary.LittleEndian.Uint32(src))
			src = src[4:]
			if m > len(src) {
				return nil, corruptf("sparse+huff: huffman block of %d bytes, %d left", m, len(src))
			}
			hs.MaxDecodedSize = huffBlock
			s, rest, err := huff0.ReadTable(src[:m], hs)
			if err != nil {
				return nil, corruptWrap(err, "sparse+huff: huffman table")
			}
			out, err := s.Decoder().Decompress4X(blk[:0:len(blk)], rest)
			if err != nil {
				return nil, corruptWrap(err, "sparse+huff: huffman block")
			}
			if len(out) != len(blk) {
				return nil, corruptf("sparse+huff: huffman block decodes to %d bytes, want %d", len(out), len(blk))
			}
			src = src[m:]
		default:
			return nil, corruptf("sparse+huff: unknown block mode %d", mode)
		}
	}
	return src, nil
}

// appendSparseHuff appends the sparse+huff encoding of src to dst.
func appendSparseHuff(dst []byte, src []float32, s *scratch) []byte {
	n := len(src)
	bl := bitmapLen(n)
	// s.a: bitmap | top bytes (n) | low bytes (3n + slack for the kernels)
	s.a = resize(s.a, bl+n+3*n+splitSlack)
	bm, top, low := s.a[:bl], s.a[bl:bl+n], s.a[bl+n:]
	nnz := sparseSplit(bm, top, low, src)
	if s.huff == nil {
		s.huff = new(huff0.Scratch)
	}
	dst = appendBlocks(dst, bm, s.huff)
	dst = appendBlocks(dst, top[:nnz], s.huff)
	return append(dst, low[:3*nnz]...)
}

// decodeSparseHuff decodes a sparse+huff payload into dst.
func decodeSparseHuff(dst []float32, payload []byte, s *scratch) error {
	n := len(dst)
	bl := bitmapLen(n)
	if s.huff == nil {
		s.huff = new(huff0.Scratch)
	}
	s.a = resize(s.a, bl+n)
	bm := s.a[:bl]
	rest, err := readBlocks(bm, payload, s.huff)
	if err != nil {
		return err
	}
	nnz, err := bitmapCount(bm, n)
	if err != nil {
		return err
	}
	top := s.a[bl : bl+nnz]
	rest, err = readBlocks(top, rest, s.huff)
	if err != nil {
		return err
	}
	if len(rest) != 3*nnz {
		return corruptf("sparse+huff: %d low bytes for %d values", len(rest), nnz)
	}
	sparseJoin(dst, bm, top, rest)
	return nil
}

// splitSlack is the room sparseSplit needs in low past 3 bytes per element.
const splitSlack = 16

// sparseSplit writes the bitmap of src into bm, the top byte of each
// non-zero element into top (len(top) >= len(src)) and its low three bytes
// into low (len(low) >= 3*len(src)+splitSlack), and returns the number of
// non-zero elements.
func sparseSplit(bm, top, low []byte, src []float32) int {
	n := len(src)
	bm, top, low = bm[:bitmapLen(n)], top[:n], low[:3*n+splitSlack]
	k := 0
	i := 0
	if useSparseAVX && n >= 64 {
		// Its stores stay inside top[:i] and low[:3*i+16] at element i.
		k = sparseSplitAVX(&bm[0], &top[0], &low[0], &src[0], n/64)
		i = n &^ 63
	}
	if nativeLE {
		for ; i+64 <= n; i += 64 {
			blk := (*[64]uint32)(unsafe.Pointer((*[64]float32)(src[i : i+64])))
			// k <= i: the windows below hold every store of this block
			// (top at offset o <= 63, low at 3*o+3 <= 192).
			pt := unsafe.Pointer(unsafe.SliceData(top[k : k+64]))
			pl := unsafe.Pointer(unsafe.SliceData(low[3*k : 3*k+193]))
			o := uintptr(0)
			var w uint64
			for _, b := range blk {
				*(*byte)(unsafe.Add(pt, o)) = byte(b >> 24)
				*(*uint32)(unsafe.Add(pl, 3*o)) = b
				nz := b2u(b != 0)
				o += uintptr(nz)
				w = w>>1 | uint64(nz)<<63
			}
			binary.LittleEndian.PutUint64(bm[i/8:], w)
			k += int(o)
		}
	}
	clear(bm[i/8:])
	for ; i < n; i++ {
		b := math.Float32bits(src[i])
		if b != 0 {
			bm[i/8] |= 1 << (i % 8)
			top[k] = byte(b >> 24)
			low[3*k], low[3*k+1], low[3*k+2] = byte(b), byte(b>>8), byte(b>>16)
			k++
		}
	}
	return k
}

// sparseJoin inverts sparseSplit: len(top) and len(low)/3 equal the
// bitmap's population count, which the caller has checked.
func sparseJoin(dst []float32, bm, top, low []byte) {
	n := len(dst)
	k := 0
	i := 0
	if useSparseAVX && n >= 64 && len(top) > 0 && len(low) > 0 {
		// It stops before reading past top or low.
		done, used := sparseJoinAVX(&dst[0], &bm[0], &top[0], &low[0], n/64, len(top), len(low))
		i, k = 64*done, used
	}
	if nativeLE {
		for ; i+64 <= n && k+64 <= len(top) && 3*k+193 <= len(low); i += 64 {
			w := binary.LittleEndian.Uint64(bm[i/8:])
			out := (*[64]uint32)(unsafe.Pointer((*[64]float32)(dst[i : i+64])))
			// Every load of this block stays inside the windows:
			// top at o <= 63, low at 3*o+3 <= 192.
			pt := unsafe.Pointer(unsafe.SliceData(top[k : k+64]))
			pl := unsafe.Pointer(unsafe.SliceData(low[3*k : 3*k+193]))
			o := uintptr(0)
			for j := range out {
				bit := uint32(w) & 1
				w >>= 1
				v := uint32(*(*byte)(unsafe.Add(pt, o)))<<24 | *(*uint32)(unsafe.Add(pl, 3*o))&0xffffff
				out[j] = v & -bit
				o += uintptr(bit)
			}
			k += int(o)
		}
	}
	for ; i < n; i++ {
		if bm[i/8]>>(i%8)&1 != 0 {
			dst[i] = math.Float32frombits(uint32(top[k])<<24 | uint32(low[3*k+2])<<16 | uint32(low[3*k+1])<<8 | uint32(low[3*k]))
			k++
		} else {
			dst[i] = 0
		}
	}
}
