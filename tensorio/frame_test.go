package tensorio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/ppnode/ppnode/nn"
)

func losslessCodecs() []Codec {
	var cs []Codec
	for _, c := range Codecs() {
		if c.Lossless() {
			cs = append(cs, c)
		}
	}
	return cs
}

// TestLosslessRoundTrip is the property test: every lossless codec returns
// random tensors of random shapes bit for bit, through both APIs.
func TestLosslessRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range losslessCodecs() {
		t.Run(c.String(), func(t *testing.T) {
			for trial := range 200 {
				maxN := 2000
				if trial%20 == 0 {
					maxN = 100000
				}
				x := randTensor(r, randShape(r, maxN), trial%numFills)
				frame, err := AppendFrame(nil, x, c)
				if err != nil {
					t.Fatal(err)
				}
				got, n, err := DecodeFrame(frame, nil)
				if err != nil {
					t.Fatalf("shape %v fill %d: %v", x.Shape(), trial%numFills, err)
				}
				if n != len(frame) {
					t.Fatalf("consumed %d of %d bytes", n, len(frame))
				}
				sameBits(t, c.String(), got, x)
				// Decoding into the same tensor again reuses it.
				again, _, err := DecodeFrame(frame, got)
				if err != nil || again != got {
					t.Fatalf("decode into a fitting tensor: %v, same=%v", err, again == got)
				}
				sameBits(t, c.String(), again, x)
			}
		})
	}
}

// TestSparseKernels compares the fast sparse kernels (assembly where the
// CPU has it, and the Go block loops) and the portable ones against a
// naive oracle, at every length around the block size.
func TestSparseKernels(t *testing.T) {
	modes := []bool{false}
	if hasSparseAVX {
		modes = append(modes, true)
	}
	defer func(old bool) { useSparseAVX = old }(useSparseAVX)
	for _, avx := range modes {
		useSparseAVX = avx
		t.Run(fmt.Sprintf("avx=%v", avx), testSparseKernels)
	}
}

func testSparseKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	lengths := make([]int, 0, 310)
	for n := range 300 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4096, 4096+63, 1<<16+5)
	for _, n := range lengths {
		for kind := range numFills {
			src := make([]float32, n)
			fillData(r, src, kind)
			// Oracle.
			want := make([]byte, bitmapLen(n))
			for i, x := range src {
				if b := math.Float32bits(x); b != 0 {
					want[i/8] |= 1 << (i % 8)
					want = binary.LittleEndian.AppendUint32(want, b)
				}
			}
			for name, enc := range map[string]func([]byte, []float32) int{"le": sparseEncodeLE, "portable": sparseEncodePortable} {
				dst := make([]byte, sparseMaxLen(n))
				for i := range dst {
					dst[i] = 0xa5 // garbage the encoder must overwrite
				}
				m := enc(dst, src)
				if !bytes.Equal(dst[:m], want) {
					t.Fatalf("%s encode n=%d kind=%d differs from the oracle", name, n, kind)
				}
			}
			if err := sparseCheck(want, n); err != nil {
				t.Fatal(err)
			}
			for name, dec := range map[string]func([]float32, []byte){"le": sparseDecodeLE, "portable": sparseDecodePortable} {
				out := make([]float32, n)
				for i := range out {
					out[i] = 42
				}
				dec(out, want)
				for i := range src {
					if math.Float32bits(out[i]) != math.Float32bits(src[i]) {
						t.Fatalf("%s decode n=%d kind=%d: element %d", name, n, kind, i)
					}
				}
			}
			// Split and join (sparse+huff, sparse+zstd) against the
			// oracle's values, with exactly sized inputs to join.
			bm, top, low := make([]byte, bitmapLen(n)), make([]byte, n), make([]byte, 3*n+splitSlack)
			for i := range low {
				low[i] = 0xa5
			}
			nnz := sparseSplit(bm, top, low, src)
			vals := want[bitmapLen(n):]
			if !bytes.Equal(bm, want[:bitmapLen(n)]) || nnz != len(vals)/4 {
				t.Fatalf("split n=%d kind=%d: bitmap or count (%d) differs", n, kind, nnz)
			}
			for k := range nnz {
				v := vals[4*k:]
				if top[k] != v[3] || low[3*k] != v[0] || low[3*k+1] != v[1] || low[3*k+2] != v[2] {
					t.Fatalf("split n=%d kind=%d: value %d", n, kind, k)
				}
			}
			out := make([]float32, n)
			for i := range out {
				out[i] = 42
			}
			sparseJoin(out, bm, bytes.Clone(top[:nnz]), bytes.Clone(low[:3*nnz]))
			for i := range src {
				if math.Float32bits(out[i]) != math.Float32bits(src[i]) {
					t.Fatalf("join n=%d kind=%d: element %d", n, kind, i)
				}
			}
		}
	}
}

func TestShuffle(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for n := 0; n < 40; n++ {
		src := make([]byte, 4*n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		sh := make([]byte, len(src))
		shuffle4(sh, src)
		for i := range n {
			for k := range 4 {
				if sh[k*n+i] != src[4*i+k] {
					t.Fatalf("n=%d: plane %d element %d", n, k, i)
				}
			}
		}
		back := make([]byte, len(src))
		unshuffle4(back, sh)
		if !bytes.Equal(back, src) {
			t.Fatalf("n=%d: unshuffle does not invert shuffle", n)
		}
	}
}

// TestBF16 checks round-to-nearest-even and the documented error bound:
// relative error at most 2^-8 for normal values, absolute error at most
// 2^-134 for subnormal ones, Inf and NaN preserved, overflow to Inf only
// above the largest bfloat16 plus half an ulp.
func TestBF16(t *testing.T) {
	exact := map[uint32]uint16{
		0x3f808000: 0x3f80, // tie, even below
		0x3f818000: 0x3f82, // tie, odd below: round up
		0x3f808001: 0x3f81, // above the tie
		0x7f7fffff: 0x7f80, // MaxFloat32 overflows to Inf
		0x7f7f7fff: 0x7f7f, // just below the overflow tie
		0x7f800001: 0x7fc0, // NaN with payload in the low half stays NaN
		0xff800000: 0xff80, // -Inf
		0x80000000: 0x8000, // -0
	}
	for in, want := range exact {
		if got := bf16Round(math.Float32frombits(in)); got != want {
			t.Errorf("bf16(%08x) = %04x, want %04x", in, got, want)
		}
	}
	r := rand.New(rand.NewPCG(13, 14))
	x := nn.New(100000)
	fillData(r, nn.F32(x), fillBits)
	frame, err := AppendFrame(nil, x, CodecBF16)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := DecodeFrame(frame, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range nn.F32(x) {
		g := nn.F32(got)[i]
		a := math.Abs(float64(v))
		switch {
		case math.IsNaN(float64(v)):
			if !math.IsNaN(float64(g)) {
				t.Fatalf("NaN %08x became %v", math.Float32bits(v), g)
			}
		case math.IsInf(float64(v), 0) || a >= 0x1.ffp127: // rounds to Inf
			if !math.IsInf(float64(g), 0) || math.Signbit(float64(g)) != math.Signbit(float64(v)) {
				t.Fatalf("%v became %v, want Inf of the same sign", v, g)
			}
		case a < 0x1p-126:
			if d := math.Abs(float64(g) - float64(v)); d > 0x1p-134 {
				t.Fatalf("subnormal %v became %v: error %v", v, g, d)
			}
		default:
			if d := math.Abs(float64(g)-float64(v)) / a; d > 0x1p-8 {
				t.Fatalf("%v became %v: relative error %v", v, g, d)
			}
		}
	}
	if n := len(frame) - FrameHeaderLen(1); n != 2*100000 {
		t.Fatalf("bf16 payload %d bytes, want %d", n, 200000)
	}
}

// TestInt8 checks the documented error bound (half a block's scale), the
// payload size (a quarter of raw plus one scale per 64 values), and that
// non-finite values decode as NaN without spoiling their block.
func TestInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for fill := range numFills {
		x := randTensor(r, []int{1000, 3}, fill)
		frame, err := AppendFrame(nil, x, CodecInt8)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := DecodeFrame(frame, nil)
		if err != nil {
			t.Fatal(err)
		}
		int8Within(t, nn.F32(x), nn.F32(got))
		if n := len(frame) - FrameHeaderLen(2); n != 3000+4*47 {
			t.Fatalf("int8 payload %d bytes, want %d", n, 3000+4*47)
		}
	}
	x := []float32{2, float32(math.Inf(1)), -2, float32(math.NaN()), 0}
	b := make([]byte, int8Len(len(x)))
	int8Encode(b, x)
	got := make([]float32, len(x))
	if err := int8Decode(got, b); err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 || got[2] != -2 || got[4] != 0 || !math.IsNaN(float64(got[1])) || !math.IsNaN(float64(got[3])) {
		t.Fatalf("int8 of %v decodes to %v", x, got)
	}
	binary.LittleEndian.PutUint32(b, math.Float32bits(-1))
	if err := int8Decode(got, b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("negative scale: %v", err)
	}
}

// int8Within checks that got is x quantized by int8: each finite value
// within half its block's scale (plus the scale's own rounding), each
// non-finite one NaN.
func int8Within(t testing.TB, x, got []float32) {
	t.Helper()
	for lo := 0; lo < len(x); lo += int8Block {
		blk := x[lo:min(lo+int8Block, len(x))]
		amax := 0.0
		for _, v := range blk {
			if a := math.Abs(float64(v)); a > amax && !math.IsInf(a, 0) {
				amax = a
			}
		}
		bound := amax/127/2 + amax*0x1p-22 + 127*0x1p-150 // the scale rounds to a multiple of 2^-149
		for i, v := range blk {
			g := float64(got[lo+i])
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				if !math.IsNaN(g) {
					t.Fatalf("element %d: %v became %v, want NaN", lo+i, v, g)
				}
				continue
			}
			if d := math.Abs(g - float64(v)); !(d <= bound) {
				t.Fatalf("element %d: %v became %v: error %g above %g", lo+i, v, g, d, bound)
			}
		}
	}
}

func TestFrameLayout(t *testing.T) {
	x := nn.FromData([]float32{1, 0, -2, 0, 0, 3}, 2, 3)
	frame, err := AppendFrame([]byte("prefix"), x, CodecSparse)
	if err != nil {
		t.Fatal(err)
	}
	if string(frame[:6]) != "prefix" {
		t.Fatal("AppendFrame clobbered dst")
	}
	f := frame[6:]
	le := binary.LittleEndian
	if string(f[:4]) != "PPTF" || f[4] != 1 || DType(f[5]) != F32 || Codec(f[6]) != CodecSparse || f[7] != 2 {
		t.Fatalf("bad fixed header % x", f[:8])
	}
	if le.Uint32(f[8:]) != 2 || le.Uint32(f[12:]) != 3 || le.Uint64(f[16:]) != 24 || le.Uint64(f[24:]) != 1+12 {
		t.Fatalf("bad dims or lengths % x", f[8:32])
	}
	payload := f[40:]
	if len(payload) != 13 || payload[0] != 0b100101 || le.Uint32(payload[1:]) != math.Float32bits(1) {
		t.Fatalf("bad payload % x", payload)
	}
	if le.Uint32(f[32:]) != crc(payload) || le.Uint32(f[36:]) != crc(f[:36]) {
		t.Fatal("bad checksums")
	}
	h, hl, err := parseFrameHeader(f, MaxElements)
	if err != nil || h.codec != CodecSparse || !nn.SameShape(h.shape(), []int{2, 3}) || h.encLen != 13 || hl != 40 {
		t.Fatalf("parseFrameHeader = %+v, %d, %v", h, hl, err)
	}
}

// refix recomputes the checksums of the frame at the start of b after a
// test edited it, so that the decoder's deeper checks are reached.
func refix(b []byte) {
	rank := int(b[7])
	hl := FrameHeaderLen(rank)
	enc := int(binary.LittleEndian.Uint64(b[16+4*rank:]))
	if hl+enc <= len(b) {
		binary.LittleEndian.PutUint32(b[hl-8:], crc(b[hl:hl+enc]))
	}
	binary.LittleEndian.PutUint32(b[hl-4:], crc(b[:hl-4]))
}

func TestFrameBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	x := randTensor(r, []int{8, 33}, fillReLU)
	le := binary.LittleEndian
	for _, c := range Codecs() {
		good, err := AppendFrame(nil, x, c)
		if err != nil {
			t.Fatal(err)
		}
		hl := FrameHeaderLen(2)
		edits := map[string]func(b []byte) []byte{
			"truncated header":  func(b []byte) []byte { return b[:hl-1] },
			"truncated payload": func(b []byte) []byte { return b[:len(b)-1] },
			"empty":             func(b []byte) []byte { return nil },
			"bad magic":         func(b []byte) []byte { b[0] = 'X'; return b },
			"bad version":       func(b []byte) []byte { b[4] = 9; refix(b); return b },
			"bad dtype":         func(b []byte) []byte { b[5] = byte(F64); refix(b); return b },
			"bad codec":         func(b []byte) []byte { b[6] = 200; refix(b); return b },
			"rank 200":          func(b []byte) []byte { b[7] = 200; return b },
			"header bit flip":   func(b []byte) []byte { b[9] ^= 1; return b },
			"payload bit flip":  func(b []byte) []byte { b[len(b)-1] ^= 0x10; return b },
			"2^40 elements": func(b []byte) []byte {
				le.PutUint32(b[8:], 1<<20)
				le.PutUint32(b[12:], 1<<20)
				le.PutUint64(b[16:], 4<<40)
				refix(b)
				return b
			},
			"raw length lies": func(b []byte) []byte { le.PutUint64(b[16:], le.Uint64(b[16:])+4); refix(b); return b },
			"enc length lies": func(b []byte) []byte { le.PutUint64(b[24:], le.Uint64(b[24:])-1); refix(b); return b[:len(b)-1] },
			"shape lies": func(b []byte) []byte {
				le.PutUint32(b[8:], 4)
				le.PutUint32(b[12:], 67)
				refix(b)
				return b
			},
			"payload garbage": func(b []byte) []byte {
				for i := hl; i < len(b); i++ {
					b[i] = byte(r.Uint32())
				}
				refix(b)
				return b
			},
		}
		for name, edit := range edits {
			b := edit(bytes.Clone(good))
			_, _, err := DecodeFrame(b, nil)
			if name == "payload garbage" && (c == CodecRaw || c == CodecBF16) {
				if err != nil {
					t.Errorf("%v %s: %v", c, name, err)
				}
				continue
			}
			if name == "payload garbage" && c == CodecInt8 && err == nil {
				continue // random scales may all be valid
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("%v %s: error %v does not wrap ErrCorrupt", c, name, err)
			}
			_, err = NewReader(bytes.NewReader(b)).ReadTensor(nil)
			if !errors.Is(err, ErrCorrupt) && !(name == "empty" && err == io.EOF) {
				t.Errorf("%v %s: Reader error %v does not wrap ErrCorrupt", c, name, err)
			}
		}
	}
}

// TestStream writes frames of every codec and reads them back through
// readers that return one byte or half the request at a time.
func TestStream(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	var want []*nn.Tensor
	var buf bytes.Buffer
	w := NewWriter(&buf, CodecRaw)
	for i := range 60 {
		c := Codecs()[i%len(Codecs())]
		if !c.Lossless() {
			continue
		}
		w.SetCodec(c)
		x := randTensor(r, randShape(r, 3000), i%numFills)
		if err := w.WriteTensor(x); err != nil {
			t.Fatal(err)
		}
		want = append(want, x)
	}
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"whole": func(r io.Reader) io.Reader { return r },
		"one":   iotest.OneByteReader,
		"half":  iotest.HalfReader,
	} {
		rd := NewReader(wrap(bytes.NewReader(buf.Bytes())))
		var dst *nn.Tensor
		for i, x := range want {
			got, err := rd.ReadTensor(dst)
			if err != nil {
				t.Fatalf("%s: frame %d: %v", name, i, err)
			}
			sameBits(t, name, got, x)
			dst = got
		}
		if _, err := rd.ReadTensor(dst); err != io.EOF {
			t.Fatalf("%s: at the end: %v, want io.EOF", name, err)
		}
	}
	// A stream cut inside a frame.
	rd := NewReader(bytes.NewReader(buf.Bytes()[:buf.Len()-3]))
	var err error
	for err == nil {
		_, err = rd.ReadTensor(nil)
	}
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut stream: %v", err)
	}
}

// TestReaderLimit checks that a Reader rejects a frame above its limit
// before reading or allocating the payload.
func TestReaderLimit(t *testing.T) {
	frame, _ := AppendFrame(nil, nn.New(1000), CodecRaw)
	rd := NewReader(bytes.NewReader(frame))
	rd.SetMaxElements(999)
	if _, err := rd.ReadTensor(nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("frame above the limit: %v", err)
	}
	// A header claiming 2^28 elements with no payload behind it: the
	// reader must fail without allocating a gigabyte.
	big := nn.FromData(nil, 0)
	hdr, _ := AppendFrame(nil, big, CodecS2)
	le := binary.LittleEndian
	le.PutUint32(hdr[8:], MaxElements)
	le.PutUint64(hdr[12:], 4*MaxElements)
	le.PutUint64(hdr[20:], 1<<29)
	refix(hdr)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := NewReader(bytes.NewReader(hdr)).ReadTensor(nn.New(1)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("lying header: %v", err)
	}
	runtime.ReadMemStats(&after)
	if a := after.TotalAlloc - before.TotalAlloc; a > 8<<20 {
		t.Fatalf("a 52-byte lying header made the reader allocate %d bytes", a)
	}
}

func TestEncodeErrors(t *testing.T) {
	x := nn.New(4, 4)
	if _, err := AppendFrame(nil, x, Codec(99)); err == nil {
		t.Error("invalid codec accepted")
	}
	tr, err := x.SafeT(1, 0)
	if err == nil {
		if _, err := AppendFrame(nil, tr, CodecRaw); err == nil && tr.RequiresIterator() {
			t.Error("transposed view accepted")
		}
	}
	if _, err := AppendFrame(nil, nn.New(1, 1, 1, 1, 1, 1, 1, 1, 1), CodecRaw); err == nil {
		t.Error("rank 9 accepted")
	}
	for _, name := range []string{"raw", "sparse+zstd", "bf16", "int8"} {
		c, err := ParseCodec(name)
		if err != nil || c.String() != name {
			t.Errorf("ParseCodec(%q) = %v, %v", name, c, err)
		}
	}
	if _, err := ParseCodec("gzip"); err == nil {
		t.Error("ParseCodec accepted gzip")
	}
}

// TestSteadyStateAllocs checks that encoding and decoding frames of a
// steady shape allocate nothing, through both APIs.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(19, 20))
	x := randTensor(r, []int{64, 1024}, fillReLU)
	for _, c := range Codecs() {
		var buf []byte
		dst := nn.New(64, 1024)
		round := func() {
			var err error
			buf, err = AppendFrame(buf[:0], x, c)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err = DecodeFrame(buf, dst); err != nil {
				t.Fatal(err)
			}
		}
		round()
		if a := testing.AllocsPerRun(20, round); a > 0 {
			t.Errorf("%v: []byte API: %v allocations per frame", c, a)
		}
		var stream bytes.Buffer
		w := NewWriter(&stream, c)
		rd := NewReader(&stream)
		sround := func() {
			if err := w.WriteTensor(x); err != nil {
				t.Fatal(err)
			}
			if _, err := rd.ReadTensor(dst); err != nil {
				t.Fatal(err)
			}
		}
		sround()
		if a := testing.AllocsPerRun(20, sround); a > 0 {
			t.Errorf("%v: stream API: %v allocations per frame", c, a)
		}
	}
}
