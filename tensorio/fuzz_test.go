package tensorio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/ppnode/ppnode/nn"
)

// The seed corpora live in testdata/fuzz/<target>/; TestWriteFuzzCorpus
// regenerates them (TENSORIO_WRITE_CORPUS=1 go test -run WriteFuzzCorpus).

// fuzzFrames returns small frames of every codec.
func fuzzFrames() [][]byte {
	r := rand.New(rand.NewPCG(31, 32))
	var out [][]byte
	shapes := [][]int{{0}, {1}, {3, 5}, {2, 2, 17}, {130}}
	for i, c := range Codecs() {
		for j, s := range shapes {
			x := randTensor(r, s, (i+j)%numFills)
			b, err := AppendFrame(nil, x, c)
			if err != nil {
				panic(err)
			}
			out = append(out, b)
		}
	}
	return out
}

func fuzzCheckpoints() [][]byte {
	var out [][]byte
	for _, c := range []*Checkpoint{testCheckpoint("job", 3, 8), {JobID: "j", Step: 1}} {
		var buf bytes.Buffer
		if err := WriteCheckpoint(&buf, c); err != nil {
			panic(err)
		}
		out = append(out, buf.Bytes())
	}
	return out
}

func fuzzSafetensors() [][]byte {
	r := rand.New(rand.NewPCG(33, 34))
	var out [][]byte
	var buf bytes.Buffer
	WriteSafetensors(&buf, []Named{{"a", randTensor(r, []int{2, 3}, fillSpecial)}, {"b", nn.New(0)}}, map[string]string{"k": "v"})
	out = append(out, bytes.Clone(buf.Bytes()))
	le := binary.LittleEndian
	es := []Entry{
		I64Entry("labels", []int64{1, 2, 3}),
		{Name: "h", DType: F16, Shape: []int{2}, Data: le.AppendUint16(le.AppendUint16(nil, 0x3c00), 0x0001)},
		{Name: "bf", DType: BF16, Shape: []int{}, Data: le.AppendUint16(nil, 0x3f80)},
		{Name: "d", DType: F64, Shape: []int{1}, Data: le.AppendUint64(nil, math.Float64bits(2.5))},
		{Name: "u", DType: U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
		{Name: "i", DType: I32, Shape: []int{1, 1}, Data: le.AppendUint32(nil, 7)},
	}
	buf.Reset()
	WriteSafetensorsEntries(&buf, es, nil)
	out = append(out, bytes.Clone(buf.Bytes()))
	// A name in UTF-8, and the same file with a byte of it made invalid.
	buf.Reset()
	WriteSafetensors(&buf, []Named{{"poids_\u00e9", randTensor(r, []int{2}, fillGauss)}}, map[string]string{"r\u00f4le": "\u2713"})
	out = append(out, bytes.Clone(buf.Bytes()))
	bad := bytes.Clone(buf.Bytes())
	bad[bytes.Index(bad, []byte("\u00e9"))] = 0xff
	return append(out, bad)
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame decoders: they must
// never panic, must fail with ErrCorrupt, and what they accept must
// re-encode to the same values. A second pass repairs the checksums so
// that the codecs' own checks are exercised.
func FuzzDecodeFrame(f *testing.F) {
	for _, b := range fuzzFrames() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFrameBytes(t, data)
		h, _, err := parseFrameHeader(data, MaxElements)
		if err != nil && len(data) >= framePrefix && int(data[7]) <= MaxRank && len(data) >= FrameHeaderLen(int(data[7])) {
			// Repair the header checksum and look again.
			fixed := bytes.Clone(data)
			hl := FrameHeaderLen(int(data[7]))
			binary.LittleEndian.PutUint32(fixed[hl-4:], crc(fixed[:hl-4]))
			h, _, err = parseFrameHeader(fixed, MaxElements)
			data = fixed
		}
		if err != nil || 4*h.n > 4<<20 {
			return
		}
		fixed := bytes.Clone(data)
		refix(fixed)
		checkFrameBytes(t, fixed)
	})
}

func checkFrameBytes(t *testing.T, data []byte) {
	x, n, err := DecodeFrame(data, nil)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error does not wrap ErrCorrupt: %v", err)
		}
	} else {
		if n > len(data) {
			t.Fatalf("consumed %d of %d bytes", n, len(data))
		}
		c := Codec(data[6])
		again, err := AppendFrame(nil, x, c)
		if err != nil {
			t.Fatal(err)
		}
		y, _, err := DecodeFrame(again, nil)
		if err != nil {
			t.Fatalf("re-encoded frame: %v", err)
		}
		if c == CodecInt8 { // requantizing moves values within the bound
			int8Within(t, nn.F32(x), nn.F32(y))
		} else {
			sameBits(t, c.String(), y, x)
		}
	}
	rd := NewReader(bytes.NewReader(data))
	rd.SetMaxElements(1 << 20)
	for {
		_, err := rd.ReadTensor(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Reader error does not wrap ErrCorrupt: %v", err)
			}
			break
		}
	}
}

// FuzzFrameRoundTrip encodes arbitrary float32 bits with every lossless
// codec and checks that they come back bit for bit.
func FuzzFrameRoundTrip(f *testing.F) {
	f.Add([]byte{}, uint8(0))
	f.Add(bytes.Repeat([]byte{0, 0, 0, 0, 1, 2, 3, 4}, 40), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, rows uint8) {
		n := len(data) / 4
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		shape := []int{n}
		if r := int(rows); r > 0 && n%r == 0 {
			shape = []int{r, n / r}
		}
		in := nn.FromData(x, shape...)
		for _, c := range losslessCodecs() {
			b, err := AppendFrame(nil, in, c)
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := DecodeFrame(b, nil)
			if err != nil {
				t.Fatalf("%v: %v", c, err)
			}
			sameBits(t, c.String(), out, in)
		}
		b, err := AppendFrame(nil, in, CodecInt8)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := DecodeFrame(b, nil)
		if err != nil {
			t.Fatalf("int8: %v", err)
		}
		int8Within(t, x, nn.F32(out))
	})
}

// FuzzReadCheckpoint: the checkpoint reader never panics, fails with
// ErrCorrupt, and what it accepts survives a write and read unchanged.
func FuzzReadCheckpoint(f *testing.F) {
	for _, b := range fuzzCheckpoints() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ReadCheckpoint(data)
		// Verifying without keeping the tensors accepts exactly the same.
		if _, verr := VerifyCheckpointAt(bytes.NewReader(data), int64(len(data))); (verr == nil) != (err == nil) {
			t.Fatalf("ReadCheckpoint: %v; VerifyCheckpointAt: %v", err, verr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteCheckpoint(&buf, c); err != nil {
			t.Fatalf("accepted checkpoint does not write: %v", err)
		}
		again, err := ReadCheckpoint(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		sameCheckpoint(t, again, c)
	})
}

// FuzzReadSafetensors: the safetensors reader never panics, fails with
// ErrCorrupt, accepts only headers of valid UTF-8, and what it accepts
// survives a write and read unchanged.
func FuzzReadSafetensors(f *testing.F) {
	for _, b := range fuzzSafetensors() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		es, meta, err := ParseSafetensors(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if hl := binary.LittleEndian.Uint64(data); !utf8.Valid(data[8 : 8+hl]) {
			t.Fatal("accepted a header that is not valid UTF-8")
		}
		var buf bytes.Buffer
		if err := WriteSafetensorsEntries(&buf, es, meta); err != nil {
			t.Fatalf("accepted file does not write: %v", err)
		}
		es2, meta2, err := ParseSafetensors(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if len(es2) != len(es) || len(meta2) != len(meta) {
			t.Fatalf("%d entries and %d metadata after a round trip, want %d and %d", len(es2), len(meta2), len(es), len(meta))
		}
		for i, e := range es {
			g := es2[i]
			if g.Name != e.Name || g.DType != e.DType || !nn.SameShape(g.Shape, e.Shape) || !bytes.Equal(g.Data, e.Data) {
				t.Fatalf("entry %q changed in a round trip", e.Name)
			}
			if _, err := e.Tensor(); err != nil {
				t.Fatalf("entry %q does not convert: %v", e.Name, err)
			}
		}
		if _, _, err := ReadSafetensors(data); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWriteFuzzCorpus writes the seed corpora under testdata/fuzz when
// TENSORIO_WRITE_CORPUS is set.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("TENSORIO_WRITE_CORPUS") == "" {
		t.Skip("set TENSORIO_WRITE_CORPUS=1 to regenerate testdata/fuzz")
	}
	for target, seeds := range map[string][][]byte{
		"FuzzDecodeFrame":     fuzzFrames(),
		"FuzzReadCheckpoint":  fuzzCheckpoints(),
		"FuzzReadSafetensors": fuzzSafetensors(),
	} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
