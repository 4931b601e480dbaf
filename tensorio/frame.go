package tensorio

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/ppnode/ppnode/nn"
)

// Frame layout (all integers little-endian, r = rank):
//
//	offset   size  field
//	0        4     magic "PPTF"
//	4        1     version (1)
//	5        1     dtype (DType; F32 is the only one in version 1)
//	6        1     codec (Codec)
//	7        1     rank r, at most MaxRank
//	8        4r    dims, uint32 each, outermost first
//	8+4r     8     raw length: bytes of the decoded data (4 x elements)
//	16+4r    8     encoded length: bytes of the payload
//	24+4r    4     payload checksum: CRC-32C of the payload
//	28+4r    4     header checksum: CRC-32C of bytes [0, 28+4r)
//	32+4r          payload (encoded length bytes)
const (
	frameMagic   = "PPTF"
	frameVersion = 1

	// MaxRank is the largest rank a frame can carry.
	MaxRank = 8
	// MaxElements is the largest number of elements a frame can carry
	// (1 GiB of float32). Decoders reject larger headers before they
	// allocate anything.
	MaxElements = 1 << 28

	framePrefix    = 8  // magic, version, dtype, codec, rank
	frameSuffix    = 24 // raw length, encoded length, two checksums
	maxFrameHeader = framePrefix + 4*MaxRank + frameSuffix
)

// FrameHeaderLen is the size of the header of a frame of the given rank.
func FrameHeaderLen(rank int) int { return framePrefix + 4*rank + frameSuffix }

// frameHeader is a parsed, validated frame header.
type frameHeader struct {
	dtype      DType
	codec      Codec
	rank       int
	dims       [MaxRank]int
	n          int // elements
	encLen     int
	payloadCRC uint32
}

// shape returns a new slice holding the tensor shape; a rank-0 frame
// decodes to shape [1].
func (h *frameHeader) shape() []int {
	if h.rank == 0 {
		return []int{1}
	}
	return append([]int(nil), h.dims[:h.rank]...)
}

// sameShape reports whether t has the frame's shape, without allocating.
func (h *frameHeader) fits(t *nn.Tensor) bool {
	if t == nil || len(nn.F32(t)) != h.n || !contiguous(t) {
		return false
	}
	s := t.Shape()
	if h.rank == 0 {
		return len(s) == 1 && s[0] == 1
	}
	return nn.SameShape(s, h.dims[:h.rank])
}

// parseFrameHeader validates the header at the start of b, which must hold
// at least framePrefix bytes, and returns it with its length. It returns
// io.ErrUnexpectedEOF (not wrapped) when b is shorter than the header.
// maxElems bounds the element count.
func parseFrameHeader(b []byte, maxElems int) (h frameHeader, hl int, err error) {
	if len(b) < framePrefix {
		return h, 0, io.ErrUnexpectedEOF
	}
	if string(b[:4]) != frameMagic {
		return h, 0, corruptf("bad frame magic %q", b[:4])
	}
	if b[4] != frameVersion {
		return h, 0, corruptf("unsupported frame version %d", b[4])
	}
	h.rank = int(b[7])
	if h.rank > MaxRank {
		return h, 0, corruptf("frame rank %d exceeds %d", h.rank, MaxRank)
	}
	hl = FrameHeaderLen(h.rank)
	if len(b) < hl {
		return h, 0, io.ErrUnexpectedEOF
	}
	if got, want := crc(b[:hl-4]), binary.LittleEndian.Uint32(b[hl-4:]); got != want {
		return h, 0, corruptf("frame header checksum %08x, want %08x", got, want)
	}
	h.dtype, h.codec = DType(b[5]), Codec(b[6])
	if h.dtype != F32 {
		return h, 0, corruptf("frame dtype %v is not supported", h.dtype)
	}
	if !h.codec.valid() {
		return h, 0, corruptf("unknown codec %d", b[6])
	}
	h.n = 1
	for i := range h.rank {
		d := int(binary.LittleEndian.Uint32(b[framePrefix+4*i:]))
		h.dims[i] = d
		if d > maxElems || (d != 0 && h.n > maxElems/d) {
			dims := append([]int(nil), h.dims[:i+1]...) // not h.dims: h must not escape
			return h, 0, corruptf("frame shape %v... exceeds %d elements", dims, maxElems)
		}
		h.n *= d
	}
	if h.n > maxElems {
		return h, 0, corruptf("frame of %d elements exceeds %d", h.n, maxElems)
	}
	p := b[framePrefix+4*h.rank:]
	raw, enc := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
	if raw != 4*uint64(h.n) {
		return h, 0, corruptf("frame raw length %d for %d float32 elements", raw, h.n)
	}
	if enc < uint64(minPayload(h.codec, h.n)) || enc > uint64(maxPayload(h.codec, h.n)) {
		return h, 0, corruptf("%v payload length %d out of range for %d elements", h.codec, enc, h.n)
	}
	h.encLen = int(enc)
	h.payloadCRC = binary.LittleEndian.Uint32(p[16:])
	return h, hl, nil
}

// putFrameHeader writes a frame header for the given shape into b, which
// has length FrameHeaderLen(len(shape)).
func putFrameHeader(b []byte, shape []int, c Codec, n int, payload []byte) {
	putFrameHeaderCRC(b, shape, c, n, len(payload), crc(payload))
}

// putFrameHeaderCRC is putFrameHeader for a payload of encLen bytes whose
// checksum is known.
func putFrameHeaderCRC(b []byte, shape []int, c Codec, n, encLen int, payloadCRC uint32) {
	copy(b, frameMagic)
	b[4], b[5], b[6], b[7] = frameVersion, byte(F32), byte(c), byte(len(shape))
	for i, d := range shape {
		binary.LittleEndian.PutUint32(b[framePrefix+4*i:], uint32(d))
	}
	p := b[framePrefix+4*len(shape):]
	binary.LittleEndian.PutUint64(p, 4*uint64(n))
	binary.LittleEndian.PutUint64(p[8:], uint64(encLen))
	binary.LittleEndian.PutUint32(p[16:], payloadCRC)
	binary.LittleEndian.PutUint32(p[20:], crc(b[:len(b)-4]))
}

// checkEncodable returns the tensor's data after checking that a frame can
// carry it.
func checkEncodable(t *nn.Tensor, c Codec) ([]float32, []int, error) {
	if !c.valid() {
		return nil, nil, fmt.Errorf("tensorio: invalid codec %d", uint8(c))
	}
	data, err := tensorData(t)
	if err != nil {
		return nil, nil, err
	}
	shape := t.Shape()
	if len(shape) > MaxRank {
		return nil, nil, fmt.Errorf("tensorio: rank %d exceeds %d", len(shape), MaxRank)
	}
	for _, d := range shape {
		if d > MaxElements {
			return nil, nil, fmt.Errorf("tensorio: dimension %d exceeds %d", d, MaxElements)
		}
	}
	if len(data) > MaxElements {
		return nil, nil, fmt.Errorf("tensorio: %d elements exceed %d", len(data), MaxElements)
	}
	return data, shape, nil
}

// AppendFrame appends a frame holding t, encoded with codec c, to dst and
// returns the extended slice. It allocates only when dst lacks capacity
// (the zstd codecs borrow pooled buffers). It fails only for an invalid
// codec, a non-contiguous tensor, or one beyond MaxRank or MaxElements.
func AppendFrame(dst []byte, t *nn.Tensor, c Codec) ([]byte, error) {
	data, shape, err := checkEncodable(t, c)
	if err != nil {
		return dst, err
	}
	s := encPool.Get().(*scratch)
	defer encPool.Put(s)
	return appendFrame(dst, data, shape, c, s), nil
}

func appendFrame(dst []byte, data []float32, shape []int, c Codec, s *scratch) []byte {
	start := len(dst)
	hl := FrameHeaderLen(len(shape))
	dst = grow(dst, hl+maxPayload(c, len(data)))
	if view := f32View(data); c == CodecRaw && view != nil {
		// Copy and checksum in one pass.
		dst = dst[:start+hl+len(view)]
		sum := copyCRC(dst[start+hl:], view)
		putFrameHeaderCRC(dst[start:start+hl], shape, c, len(data), len(view), sum)
		return dst
	}
	dst = dst[:start+hl]
	dst = appendPayload(dst, data, c, s)
	putFrameHeader(dst[start:start+hl], shape, c, len(data), dst[start+hl:])
	return dst
}

// DecodeFrame decodes the frame at the start of b and returns the tensor
// and the number of bytes the frame occupies. The tensor is dst itself
// when dst has the frame's shape (the steady state: no allocation), dst
// reshaped when it has the same number of elements, and a new tensor
// otherwise. On error dst's contents are unspecified.
//
// Every error caused by the bytes of b wraps ErrCorrupt; a b shorter than
// the frame also wraps io.ErrUnexpectedEOF.
func DecodeFrame(b []byte, dst *nn.Tensor) (*nn.Tensor, int, error) {
	h, hl, err := parseFrameHeader(b, MaxElements)
	if err == io.ErrUnexpectedEOF {
		return nil, 0, corruptWrap(err, "truncated frame header (%d bytes)", len(b))
	}
	if err != nil {
		return nil, 0, err
	}
	if len(b)-hl < h.encLen {
		return nil, 0, corruptWrap(io.ErrUnexpectedEOF, "truncated frame: %d of %d payload bytes", len(b)-hl, h.encLen)
	}
	payload := b[hl : hl+h.encLen]
	t := dst
	if h.codec == CodecRaw && (dst == nil || h.fits(dst)) {
		// Copy and checksum in one pass, into dst or a new tensor (the
		// payload is all there: allocating for it is safe).
		if dst == nil {
			t = tensorFor(nil, h.shape(), h.n)
		}
		if view := f32View(nn.F32(t)); view != nil {
			if got := copyCRC(view, payload); got != h.payloadCRC {
				return nil, 0, corruptf("frame payload checksum %08x, want %08x", got, h.payloadCRC)
			}
			return t, hl + h.encLen, nil
		}
	}
	if got := crc(payload); got != h.payloadCRC {
		return nil, 0, corruptf("frame payload checksum %08x, want %08x", got, h.payloadCRC)
	}
	if !h.fits(t) {
		t = tensorFor(dst, h.shape(), h.n)
	}
	s := decPool.Get().(*scratch)
	defer decPool.Put(s)
	if err := decodePayload(nn.F32(t), payload, h.codec, s); err != nil {
		return nil, 0, err
	}
	return t, hl + h.encLen, nil
}

// checkFrame verifies the frame at the start of b as DecodeFrame does,
// keeping nothing: a raw payload is only checksummed, others are decoded
// into a tensor that is dropped. It returns the frame's shape and size.
func checkFrame(b []byte) ([]int, int, error) {
	h, hl, err := parseFrameHeader(b, MaxElements)
	if err != nil || h.codec != CodecRaw {
		t, n, err := DecodeFrame(b, nil) // its errors, or the decoding
		if err != nil {
			return nil, 0, err
		}
		return t.Shape(), n, nil
	}
	if len(b)-hl < h.encLen {
		return nil, 0, corruptWrap(io.ErrUnexpectedEOF, "truncated frame: %d of %d payload bytes", len(b)-hl, h.encLen)
	}
	if got := crc(b[hl : hl+h.encLen]); got != h.payloadCRC {
		return nil, 0, corruptf("frame payload checksum %08x, want %08x", got, h.payloadCRC)
	}
	return h.shape(), hl + h.encLen, nil
}
