package tensorio

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

//go:generate stringer -type=Codec -linecomment

// Codec is the encoding of a frame's payload. The values are part of the
// frame format; never renumber them.
type Codec uint8

// The codecs. All but CodecBF16 and CodecInt8 are lossless: decoding returns the
// encoded float32 values bit for bit, NaN payloads and -0 included.
const (
	CodecRaw         Codec = iota // raw
	CodecSparse                   // sparse
	CodecSparseHuff               // sparse+huff
	CodecSparseZstd               // sparse+zstd
	CodecShuffleZstd              // shuffle+zstd
	CodecS2                       // s2
	CodecZstd                     // zstd
	CodecBF16                     // bf16
	CodecInt8                     // int8
	numCodecs
)

// Codecs lists every codec, lossless ones first.
func Codecs() []Codec {
	return []Codec{CodecRaw, CodecSparse, CodecSparseHuff, CodecSparseZstd, CodecShuffleZstd, CodecS2, CodecZstd, CodecBF16, CodecInt8}
}

// Lossless reports whether decoding returns the input bit for bit.
func (c Codec) Lossless() bool { return c < numCodecs && c != CodecBF16 && c != CodecInt8 }

func (c Codec) valid() bool { return c < numCodecs }

// ParseCodec returns the codec with the given name, as printed by String.
func ParseCodec(name string) (Codec, error) {
	for c := CodecRaw; c < numCodecs; c++ {
		if c.String() == name {
			return c, nil
		}
	}
	return 0, fmt.Errorf("tensorio: unknown codec %q", name)
}

// The zstd encoder and decoder are shared by the whole process: both are
// safe for concurrent use and keep one internal state per CPU, which is the
// pool.
var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithEncoderCRC(false), // the frame has its own checksum
			zstd.WithSingleSegment(true),
		)
		if err != nil {
			panic(err) // only for invalid options
		}
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithDecoderMaxMemory(uint64(sparseMaxLen(MaxElements))),
			zstd.WithDecodeAllCapLimit(true), // never grow the caller's buffer
			zstd.IgnoreChecksum(true),
		)
		if err != nil {
			panic(err)
		}
		return d
	})
)

// zstdBound bounds the zstd encoding of n bytes: raw blocks of at most
// 128 KiB cost 3 bytes each, plus the frame header.
func zstdBound(n int) int { return n + n/1024 + 64 }

// scratch holds a codec's intermediate buffers. Writers and Readers own
// one; the []byte API takes one from encPool or decPool (kept apart
// because huff0 keeps different state for each direction).
type scratch struct {
	a, b []byte
	huff *huff0.Scratch
}

var (
	encPool = sync.Pool{New: func() any { return new(scratch) }}
	decPool = sync.Pool{New: func() any { return new(scratch) }}
)

// maxPayload bounds the payload of n elements with codec c.
func maxPayload(c Codec, n int) int {
	switch c {
	case CodecRaw:
		return 4 * n
	case CodecSparse:
		return sparseMaxLen(n)
	case CodecSparseHuff:
		return sparseHuffMax(n)
	case CodecSparseZstd:
		return 4 + zstdBound(bitmapLen(n)+n) + 3*n
	case CodecShuffleZstd, CodecZstd:
		return zstdBound(4 * n)
	case CodecS2:
		return s2.MaxEncodedLen(4 * n)
	case CodecBF16:
		return 2 * n
	case CodecInt8:
		return int8Len(n)
	}
	return 0
}

// minPayload is the smallest valid payload of n elements with codec c.
func minPayload(c Codec, n int) int {
	switch c {
	case CodecRaw:
		return 4 * n
	case CodecSparse:
		return bitmapLen(n)
	case CodecSparseHuff:
		return 2 * ((bitmapLen(n) + huffBlock - 1) / huffBlock) // run blocks
	case CodecBF16:
		return 2 * n
	case CodecInt8:
		return int8Len(n)
	case CodecS2:
		return 1
	}
	if n == 0 {
		return 0
	}
	return 1
}

// appendPayload appends the encoding of src with codec c to dst.
func appendPayload(dst []byte, src []float32, c Codec, s *scratch) []byte {
	n := len(src)
	start := len(dst)
	dst = grow(dst, maxPayload(c, n))
	switch c {
	case CodecRaw:
		dst = dst[:start+4*n]
		putF32s(dst[start:], src)
	case CodecSparse:
		m := sparseEncode(dst[start:start+sparseMaxLen(n)], src)
		dst = dst[:start+m]
	case CodecSparseHuff:
		dst = appendSparseHuff(dst, src, s)
	case CodecSparseZstd:
		if n == 0 {
			return dst
		}
		// As sparse+huff, but the bitmap and the top bytes, adjacent
		// in s.a, go through zstd, which also finds repeated runs.
		bl := bitmapLen(n)
		s.a = resize(s.a, bl+n+3*n+splitSlack)
		nnz := sparseSplit(s.a[:bl], s.a[bl:bl+n], s.a[bl+n:], src)
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst = zstdEncoder().EncodeAll(s.a[:bl+nnz], dst)
		binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
		dst = append(dst, s.a[bl+n:bl+n+3*nnz]...)
	case CodecShuffleZstd:
		if n == 0 {
			return dst
		}
		b := leBytes(src, &s.a)
		s.b = resize(s.b, 4*n)
		shuffle4(s.b, b)
		dst = zstdEncoder().EncodeAll(s.b, dst)
	case CodecZstd:
		if n == 0 {
			return dst
		}
		b := leBytes(src, &s.a)
		dst = zstdEncoder().EncodeAll(b, dst)
	case CodecS2:
		b := leBytes(src, &s.a)
		m := len(s2.Encode(dst[start:cap(dst)], b))
		dst = dst[:start+m]
	case CodecBF16:
		dst = dst[:start+2*n]
		bf16Encode(dst[start:], src)
	case CodecInt8:
		dst = dst[:start+int8Len(n)]
		int8Encode(dst[start:], src)
	default:
		panic("tensorio: invalid codec " + c.String())
	}
	return dst
}

// decodePayload decodes payload, encoded with codec c, into dst. Any
// inconsistency is reported as ErrCorrupt; dst may then hold garbage.
func decodePayload(dst []float32, payload []byte, c Codec, s *scratch) error {
	n := len(dst)
	switch c {
	case CodecRaw:
		if len(payload) != 4*n {
			return corruptf("raw payload of %d bytes for %d elements", len(payload), n)
		}
		getF32s(dst, payload)
	case CodecSparse:
		if err := sparseCheck(payload, n); err != nil {
			return err
		}
		sparseDecode(dst, payload)
	case CodecSparseHuff:
		return decodeSparseHuff(dst, payload, s)
	case CodecSparseZstd:
		if n == 0 {
			return emptyPayload(payload)
		}
		if len(payload) < 4 || int(binary.LittleEndian.Uint32(payload)) > len(payload)-4 {
			return corruptf("sparse+zstd: bad zstd length")
		}
		m := int(binary.LittleEndian.Uint32(payload))
		bl := bitmapLen(n)
		head, err := zstdDecode(&s.a, payload[4:4+m], bl, bl+n)
		if err != nil {
			return err
		}
		nnz, err := bitmapCount(head[:bl], n)
		if err != nil {
			return err
		}
		low := payload[4+m:]
		if len(head) != bl+nnz || len(low) != 3*nnz {
			return corruptf("sparse+zstd: %d top and %d low bytes for %d values", len(head)-bl, len(low), nnz)
		}
		sparseJoin(dst, head[:bl], head[bl:], low)
	case CodecShuffleZstd:
		if n == 0 {
			return emptyPayload(payload)
		}
		sh, err := zstdDecode(&s.a, payload, 4*n, 4*n)
		if err != nil {
			return err
		}
		s.b = resize(s.b, 4*n)
		unshuffle4(s.b, sh)
		getF32s(dst, s.b)
	case CodecZstd:
		if n == 0 {
			return emptyPayload(payload)
		}
		if b := f32View(dst); b != nil {
			_, err := zstdDecode(&b, payload, 4*n, 4*n)
			return err
		}
		b, err := zstdDecode(&s.a, payload, 4*n, 4*n)
		if err != nil {
			return err
		}
		getF32s(dst, b)
	case CodecS2:
		m, err := s2.DecodedLen(payload)
		if err != nil || m != 4*n {
			return corruptf("s2 payload decodes to %d bytes (err %v), want %d", m, err, 4*n)
		}
		b := f32View(dst)
		if b == nil {
			s.a = resize(s.a, 4*n)
			b = s.a
		}
		out, err := s2.Decode(b, payload)
		if err != nil {
			return corruptWrap(err, "s2 payload")
		}
		if len(out) != 4*n || (n > 0 && &out[0] != &b[0]) {
			return corruptf("s2 payload decodes to %d bytes, want %d", len(out), 4*n)
		}
		if f32View(dst) == nil {
			getF32s(dst, b)
		}
	case CodecBF16:
		if len(payload) != 2*n {
			return corruptf("bf16 payload of %d bytes for %d elements", len(payload), n)
		}
		bf16Decode(dst, payload)
	case CodecInt8:
		if len(payload) != int8Len(n) {
			return corruptf("int8 payload of %d bytes for %d elements", len(payload), n)
		}
		return int8Decode(dst, payload)
	default:
		return corruptf("unknown codec %d", uint8(c))
	}
	return nil
}

func emptyPayload(payload []byte) error {
	if len(payload) != 0 {
		return corruptf("%d payload bytes for an empty tensor", len(payload))
	}
	return nil
}

// zstdDecode decodes one zstd frame whose content size, declared in its
// header, must lie in [lo, hi]. It decodes into *buf, growing it to at most
// hi bytes, and never lets the decoder allocate more.
func zstdDecode(buf *[]byte, payload []byte, lo, hi int) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(payload); err != nil {
		return nil, corruptWrap(err, "zstd frame header")
	}
	if !h.HasFCS || h.FrameContentSize < uint64(lo) || h.FrameContentSize > uint64(hi) {
		return nil, corruptf("zstd frame declares %d bytes, want %d to %d", h.FrameContentSize, lo, hi)
	}
	m := int(h.FrameContentSize)
	*buf = resize(*buf, m)
	b := (*buf)[:0:m]
	out, err := zstdDecoder().DecodeAll(payload, b)
	if err != nil {
		return nil, corruptWrap(err, "zstd payload")
	}
	if len(out) != m || &out[:1][0] != &b[:1][0] {
		return nil, corruptf("zstd payload decodes to %d bytes, its header says %d", len(out), m)
	}
	return out, nil
}

// bitmapCount returns the population count of the bitmap of n elements,
// checking that no bit past element n is set.
func bitmapCount(bm []byte, n int) (int, error) {
	nnz := 0
	i := 0
	for ; i+8 <= len(bm); i += 8 {
		nnz += bits.OnesCount64(binary.LittleEndian.Uint64(bm[i:]))
	}
	for ; i < len(bm); i++ {
		nnz += bits.OnesCount8(bm[i])
	}
	if r := n % 8; r != 0 && bm[len(bm)-1]>>r != 0 {
		return 0, corruptf("sparse bitmap has bits set past element %d", n)
	}
	return nnz, nil
}

// shuffle4 transposes src, a sequence of 4-byte elements, into four byte
// planes in dst: byte k of element i goes to dst[k*n+i].
func shuffle4(dst, src []byte) {
	n := len(src) / 4
	p0, p1, p2, p3 := dst[:n], dst[n:2*n], dst[2*n:3*n], dst[3*n:4*n]
	src = src[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		s := src[4*i : 4*i+32]
		a := binary.LittleEndian.Uint64(s[0:])
		b := binary.LittleEndian.Uint64(s[8:])
		c := binary.LittleEndian.Uint64(s[16:])
		d := binary.LittleEndian.Uint64(s[24:])
		binary.LittleEndian.PutUint64(p0[i:], plane(a, b, c, d, 0))
		binary.LittleEndian.PutUint64(p1[i:], plane(a, b, c, d, 8))
		binary.LittleEndian.PutUint64(p2[i:], plane(a, b, c, d, 16))
		binary.LittleEndian.PutUint64(p3[i:], plane(a, b, c, d, 24))
	}
	for ; i < n; i++ {
		p0[i], p1[i], p2[i], p3[i] = src[4*i], src[4*i+1], src[4*i+2], src[4*i+3]
	}
}

// plane gathers byte k/8 of each of the eight 4-byte elements held in a,
// b, c, d (two per word) into one word.
func plane(a, b, c, d uint64, k uint) uint64 {
	return (a>>k)&0xff | (a>>(k+32)&0xff)<<8 |
		(b>>k&0xff)<<16 | (b>>(k+32)&0xff)<<24 |
		(c>>k&0xff)<<32 | (c>>(k+32)&0xff)<<40 |
		(d>>k&0xff)<<48 | (d>>(k+32)&0xff)<<56
}

// unshuffle4 inverts shuffle4.
func unshuffle4(dst, src []byte) {
	n := len(src) / 4
	p0, p1, p2, p3 := src[:n], src[n:2*n], src[2*n:3*n], src[3*n:4*n]
	dst = dst[:4*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		a := binary.LittleEndian.Uint64(p0[i:])
		b := binary.LittleEndian.Uint64(p1[i:])
		c := binary.LittleEndian.Uint64(p2[i:])
		d := binary.LittleEndian.Uint64(p3[i:])
		o := dst[4*i : 4*i+32]
		for j := 0; j < 4; j++ {
			s := uint(16 * j)
			binary.LittleEndian.PutUint64(o[8*j:],
				a>>s&0xff|(b>>s&0xff)<<8|(c>>s&0xff)<<16|(d>>s&0xff)<<24|
					(a>>(s+8)&0xff)<<32|(b>>(s+8)&0xff)<<40|(c>>(s+8)&0xff)<<48|(d>>(s+8)&0xff)<<56)
		}
	}
	for ; i < n; i++ {
		dst[4*i], dst[4*i+1], dst[4*i+2], dst[4*i+3] = p0[i], p1[i], p2[i], p3[i]
	}
}

// bf16Round rounds a float32 to bfloat16 (its upper 16 bits) to nearest,
// ties to even. NaNs stay NaNs (quiet), whatever their payload.
func bf16Round(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func bf16Encode(dst []byte, src []float32) {
	dst = dst[:2*len(src)]
	for i, x := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], bf16Round(x))
	}
}

func bf16Decode(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}
