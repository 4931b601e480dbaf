package tensorio

import (
	"hash/crc32"
	"unsafe"
)

// Every checksum of the formats is a CRC-32C (Castagnoli). Where the CPU
// has AVX-512 and VPCLMULQDQ (amd64), crc computes it by folding 256-byte
// blocks with carry-less multiplications while the CRC32 instruction,
// which runs on other execution units, does three more streams of the
// input beside it (crc32cHybrid): 63-80 GB/s on one core here, as the
// machine's other load varies, 1.35-1.5 times the folding alone and about
// 3 times hash/crc32's CRC32 instruction streams.
// copyCRC computes it in the same pass as a copy, so that a raw frame is
// read once, with the folding alone (crc32cFold): with the hybrid's extra
// loads, stores and CRC32 instructions in the loop the copy was faster
// only within the L2 cache of a quiet machine, and slower beyond L2 or
// when the other hyperthread of the core was busy (BENCHMARKS.md).
// Elsewhere both fall back to hash/crc32.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	// hybridBlock is what one iteration of crc32cHybrid does: 256 bytes
	// folded and 40 of each of its three CRC32 streams.
	hybridBlock = 256 + 3*40
	// hybridMin and foldMin are the shortest inputs given to crc32cHybrid
	// and crc32cFold; shorter ones, and the tail of a longer one (under a
	// block), go through hash/crc32.
	hybridMin = 1536
	foldMin   = 1024
	// ntMin is the shortest copy made with non-temporal stores, which
	// bypass the cache as the runtime's memmove does for large copies.
	// Below it normal stores are faster; above it they cost 5-20% (the
	// destination's lines are read before they are written).
	ntMin = 4 << 20

	// crc32cFold modes.
	foldCopy   = 1
	foldCopyNT = 2
)

// crc computes the CRC-32C of b.
func crc(b []byte) uint32 { return crcUpdate(0, b) }

// crcUpdate returns the CRC-32C of the bytes whose CRC-32C is c followed
// by b (as crc32.Update).
func crcUpdate(c uint32, b []byte) uint32 {
	if hasFold && len(b) >= hybridMin {
		blocks := len(b) / hybridBlock
		c = ^crc32cHybrid(&b[0], blocks, ^c)
		b = b[blocks*hybridBlock:]
	}
	return crc32.Update(c, castagnoli, b)
}

// copyCRC copies src into dst, which must be at least as long, and
// returns the CRC-32C of src.
func copyCRC(dst, src []byte) uint32 {
	dst = dst[:len(src)]
	var c uint32
	if hasFold && len(src) >= foldMin {
		mode := foldCopy
		if len(src) >= ntMin {
			// Align dst to a cache line for the non-temporal stores.
			h := int(-uintptr(unsafe.Pointer(&dst[0])) & 63)
			copy(dst[:h], src[:h])
			c = crc32.Update(c, castagnoli, src[:h])
			dst, src = dst[h:], src[h:]
			mode = foldCopyNT
		}
		n := len(src) &^ 255
		c = ^crc32cFold(&dst[0], &src[0], n, ^c, mode)
		dst, src = dst[n:], src[n:]
	}
	copy(dst, src)
	return crc32.Update(c, castagnoli, src)
}

// Checksum returns the CRC-32C (Castagnoli) of b, the checksum of frames
// and checkpoints: a raw frame's payload checksum is the Checksum of the
// tensor's little-endian float32 bytes, which are also its data in a
// safetensors file.
func Checksum(b []byte) uint32 { return crc(b) }
