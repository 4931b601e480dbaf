package tensorio

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ppnode/ppnode/nn"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		var ts []Named
		for i := range 1 + r.IntN(6) {
			ts = append(ts, Named{
				Name: string(rune('a'+r.IntN(26))) + "." + string(rune('0'+i)),
				T:    randTensor(r, randShape(r, 300), r.IntN(numFills)),
			})
		}
		meta := map[string]string{"step": "7", "quote\"<&>": "ünï\n"}
		if trial%3 == 0 {
			meta = nil
		}
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, ts, meta); err != nil {
			t.Fatal(err)
		}
		if n := binary.LittleEndian.Uint64(buf.Bytes()); n%8 != 0 {
			t.Fatalf("header length %d is not a multiple of 8", n)
		}
		got, gotMeta, err := ReadSafetensors(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(ts) {
			t.Fatalf("%d tensors, want %d", len(got), len(ts))
		}
		byName := map[string]*nn.Tensor{}
		for _, n := range ts {
			byName[n.Name] = n.T
		}
		for i, g := range got {
			if i > 0 && got[i-1].Name >= g.Name {
				t.Fatalf("tensors not sorted by name: %q after %q", g.Name, got[i-1].Name)
			}
			sameBits(t, g.Name, g.T, byName[g.Name])
		}
		if len(gotMeta) != len(meta) {
			t.Fatalf("metadata %v, want %v", gotMeta, meta)
		}
		for k, v := range meta {
			if gotMeta[k] != v {
				t.Fatalf("metadata %q = %q, want %q", k, gotMeta[k], v)
			}
		}
		if WeightsSHA256(got) != WeightsSHA256(ts) {
			t.Fatal("WeightsSHA256 differs after a round trip")
		}
	}
}

func TestSafetensorsLayout(t *testing.T) {
	es := []Entry{
		I64Entry("labels", []int64{1, -2, 3}),
		mustF32Entry(t, "z.weight", nn.FromData([]float32{1, 2, 3, 4}, 2, 2)),
		mustF32Entry(t, "a.bias", nn.FromData([]float32{5, 6}, 2)),
	}
	var buf bytes.Buffer
	if err := WriteSafetensorsEntries(&buf, es, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	n := binary.LittleEndian.Uint64(b)
	header := string(b[8 : 8+n])
	want := `{"__metadata__":{"format":"pt"},` +
		`"labels":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},` +
		`"a.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},` +
		`"z.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[32,48]}}`
	if strings.TrimRight(header, " ") != want {
		t.Fatalf("header\n%s\nwant\n%s", header, want)
	}
	if len(header)%8 != 0 {
		t.Fatalf("header of %d bytes is not padded to 8", len(header))
	}
	entries, _, err := ParseSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	v, err := entries[1].Int64s()
	if err != nil || entries[1].Name != "labels" || len(v) != 3 || v[1] != -2 {
		t.Fatalf("labels: %v %v", v, err)
	}
}

func mustF32Entry(t *testing.T, name string, x *nn.Tensor) Entry {
	t.Helper()
	e, err := F32Entry(name, x)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestF16ToF32 checks every binary16 value against a float64 oracle.
func TestF16ToF32(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		e, m := (h>>10)&0x1f, h&0x3ff
		got := f16ToF32(uint16(h))
		switch {
		case e == 0x1f && m == 0:
			if !math.IsInf(float64(got), int(sign)) {
				t.Fatalf("%04x: %v, want Inf", h, got)
			}
		case e == 0x1f:
			if got == got {
				t.Fatalf("%04x: %v, want NaN", h, got)
			}
		default:
			var want float64
			if e == 0 {
				want = sign * float64(m) * math.Pow(2, -24)
			} else {
				want = sign * (1 + float64(m)/1024) * math.Pow(2, float64(e-15))
			}
			if math.Float32bits(got) != math.Float32bits(float32(want)) {
				t.Fatalf("%04x: %v, want %v", h, got, want)
			}
		}
	}
}

func TestSafetensorsDTypes(t *testing.T) {
	le := binary.LittleEndian
	cases := []struct {
		dt   DType
		data []byte
		want []float32
	}{
		{F64, le.AppendUint64(le.AppendUint64(nil, math.Float64bits(1.5)), math.Float64bits(-1e300)), []float32{1.5, float32(math.Inf(-1))}},
		{I32, le.AppendUint32(le.AppendUint32(nil, uint32(0xffffffff)), 1<<24+1), []float32{-1, 1 << 24}},
		{I64, le.AppendUint64(nil, uint64(1)<<40), []float32{1 << 40}},
		{U8, []byte{0, 255}, []float32{0, 255}},
		{BF16, le.AppendUint16(le.AppendUint16(nil, 0x3fc0), 0xff80), []float32{1.5, float32(math.Inf(-1))}},
		{F16, le.AppendUint16(le.AppendUint16(nil, 0x3e00), 0x0001), []float32{1.5, 5.960464477539063e-08}},
	}
	for _, c := range cases {
		e := Entry{Name: c.dt.String(), DType: c.dt, Shape: []int{len(c.want)}, Data: c.data}
		var buf bytes.Buffer
		if err := WriteSafetensorsEntries(&buf, []Entry{e}, nil); err != nil {
			t.Fatal(err)
		}
		ts, _, err := ReadSafetensors(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		got := nn.F32(ts[0].T)
		for i := range c.want {
			if got[i] != c.want[i] {
				t.Errorf("%v: element %d = %v, want %v", c.dt, i, got[i], c.want[i])
			}
		}
	}
}

// stFile builds a safetensors file from a raw header and body.
func stFile(header string, body []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), body...)
}

func TestSafetensorsBadInput(t *testing.T) {
	body := make([]byte, 16)
	good := `{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`
	if _, _, err := ReadSafetensors(stFile(good, body)); err != nil {
		t.Fatalf("good file rejected: %v", err)
	}
	huge := binary.LittleEndian.AppendUint64(nil, 200<<20)
	cases := map[string][]byte{
		"empty":            nil,
		"short length":     {1, 2, 3},
		"header too big":   huge,
		"header past end":  binary.LittleEndian.AppendUint64(nil, 64),
		"max length":       binary.LittleEndian.AppendUint64(nil, math.MaxUint64),
		"not json":         stFile(`{"a":`, body),
		"json array":       stFile(`[1,2]`, body),
		"json null":        stFile(`null`, body),
		"unknown dtype":    stFile(`{"a":{"dtype":"F8","shape":[16],"data_offsets":[0,16]}}`, body),
		"negative dim":     stFile(`{"a":{"dtype":"U8","shape":[-4,-4],"data_offsets":[0,16]}}`, body),
		"huge shape":       stFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}}`, body),
		"huge empty shape": stFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}}`, body),
		"dim overflow":     stFile(`{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16]}}`, body),
		"no shape":         stFile(`{"a":{"dtype":"F32","data_offsets":[0,16]}}`, body),
		"size mismatch":    stFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, body),
		"one offset":       stFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0]}}`, body),
		"offsets reversed": stFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}`, body),
		"out of range":     stFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, body),
		"overlap":          stFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, body),
		"gap":              stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, body),
		"trailing bytes":   stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, body),
		"duplicate name":   stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, body),
		"bad metadata":     stFile(`{"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, body),
		"truncated body":   stFile(good, body[:15]),
	}
	for name, data := range cases {
		_, _, err := ReadSafetensors(data)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: error %v does not wrap ErrCorrupt", name, err)
		}
	}
}

// TestSafetensorsUTF8: a header that is not valid UTF-8 is refused (as by
// the reference implementation), with the byte named; valid non-ASCII
// names are kept as they are.
func TestSafetensorsUTF8(t *testing.T) {
	body := make([]byte, 8)
	for name, header := range map[string]string{
		"invalid byte in a name":   `{"a` + "\xff" + `":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		"cut sequence in metadata": `{"__metadata__":{"k":"` + "\xe2\x82" + `"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		"overlong encoding":        `{"a` + "\xc0\xaf" + `":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		"encoded surrogate":        `{"a` + "\xed\xa0\x80" + `":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`,
		"in the padding":           `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  ` + "\x80",
	} {
		_, _, err := ParseSafetensors(stFile(header, body))
		at := 8 + strings.IndexFunc(header, func(r rune) bool { return r == utf8.RuneError })
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not valid UTF-8") || !strings.Contains(err.Error(), fmt.Sprintf("byte %d ", at)) {
			t.Errorf("%s: %v, want ErrCorrupt naming byte %d", name, err, at)
		}
	}
	name := "poids_é✓😀"
	es, _, err := ParseSafetensors(stFile(`{"`+name+`":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, body))
	if err != nil || len(es) != 1 || es[0].Name != name {
		t.Fatalf("valid UTF-8 name: %+v, %v", es, err)
	}
}

func TestSaveLoadSafetensors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	r := rand.New(rand.NewPCG(3, 4))
	ts := []Named{{"w", randTensor(r, []int{7, 9}, fillSpecial)}, {"b", randTensor(r, []int{9}, fillGauss)}}
	for range 2 { // the second save replaces the first
		if err := SaveSafetensors(path, ts, map[string]string{"k": "v"}); err != nil {
			t.Fatal(err)
		}
	}
	got, meta, err := LoadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if meta["k"] != "v" || len(got) != 2 || got[0].Name != "b" {
		t.Fatalf("got %v %v", got, meta)
	}
	sameBits(t, "w", got[1].T, ts[0].T)
	files, _ := os.ReadDir(dir)
	if len(files) != 1 {
		t.Fatalf("directory holds %d files, want 1 (no temporaries)", len(files))
	}
}

func TestWeightsSHA256(t *testing.T) {
	a := nn.FromData([]float32{1, 2}, 2)
	negZero := float32(math.Copysign(0, -1))
	b := nn.FromData([]float32{negZero, float32(math.Inf(1)), 3}, 3)
	h := sha256.New()
	for _, x := range append(append([]float32{}, nn.F32(a)...), nn.F32(b)...) {
		h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)))
	}
	want := hex.EncodeToString(h.Sum(nil))
	if got := WeightsSHA256([]Named{{"b", b}, {"a", a}}); got != want {
		t.Fatalf("WeightsSHA256 = %s, want %s", got, want)
	}
	if WeightsSHA256([]Named{{"a", a}, {"b", b}}) != want {
		t.Fatal("WeightsSHA256 depends on input order")
	}
	nn.F32(b)[0] = 0 // -0 -> +0 changes the bits
	if WeightsSHA256([]Named{{"a", a}, {"b", b}}) == want {
		t.Fatal("WeightsSHA256 ignores the sign of zero")
	}
}

// torchResult is what testdata/torch_safetensors.py prints.
type torchResult struct {
	Metadata map[string]string
	Tensors  map[string]struct {
		DType string
		Shape []int
		Bits  []uint32
	}
}

// runTorch runs testdata/torch_safetensors.py once: PyTorch reads in and
// writes out.
func runTorch(t *testing.T, in, out string) (read, wrote torchResult) {
	t.Helper()
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("PyTorch interop test skipped: %s not found; install Debian's python3-torch", python)
	}
	cmd := exec.Command(python, filepath.Join("testdata", "torch_safetensors.py"), in, out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 77 {
		t.Skipf("PyTorch interop test skipped: %s cannot import torch and numpy (%s); install Debian's python3-torch", python, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		t.Fatalf("torch_safetensors.py: %v\n%s", err, stderr.String())
	}
	var res struct{ Read, Write torchResult }
	if err := json.Unmarshal(stdout, &res); err != nil {
		t.Fatal(err)
	}
	return res.Read, res.Write
}

// TestSafetensorsTorch writes a file with ppnode and reads it with PyTorch,
// then the reverse, comparing every value bit for bit.
func TestSafetensorsTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Python")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(5, 6))
	ts := []Named{
		{"layer1.weight", randTensor(r, []int{16, 8}, fillSpecial)},
		{"layer1.bias", randTensor(r, []int{16}, fillGauss)},
		{"act", randTensor(r, []int{2, 3, 4, 5}, fillReLU)},
		{"empty", nn.New(0, 4)},
	}
	path := filepath.Join(dir, "ppnode.safetensors")
	if err := SaveSafetensors(path, ts, map[string]string{"format": "pt", "writer": "ppnode"}); err != nil {
		t.Fatal(err)
	}
	torchPath := filepath.Join(dir, "torch.safetensors")
	res, want := runTorch(t, path, torchPath)
	if res.Metadata["writer"] != "ppnode" {
		t.Errorf("PyTorch read metadata %v", res.Metadata)
	}
	if len(res.Tensors) != len(ts) {
		t.Fatalf("PyTorch read %d tensors, want %d", len(res.Tensors), len(ts))
	}
	for _, n := range ts {
		got, ok := res.Tensors[n.Name]
		if !ok {
			t.Fatalf("PyTorch did not read %q", n.Name)
		}
		if !nn.SameShape(got.Shape, n.T.Shape()) || got.DType != "F32" {
			t.Fatalf("%s: PyTorch read %s%v, want F32%v", n.Name, got.DType, got.Shape, n.T.Shape())
		}
		for i, x := range nn.F32(n.T) {
			if got.Bits[i] != math.Float32bits(x) {
				t.Fatalf("%s[%d]: PyTorch read %08x, want %08x", n.Name, i, got.Bits[i], math.Float32bits(x))
			}
		}
	}

	got, meta, err := LoadSafetensors(torchPath)
	if err != nil {
		t.Fatal(err)
	}
	if meta["source"] != "torch" {
		t.Errorf("metadata %v", meta)
	}
	if len(got) != len(want.Tensors) {
		t.Fatalf("read %d tensors, PyTorch wrote %d", len(got), len(want.Tensors))
	}
	for _, n := range got {
		w := want.Tensors[n.Name]
		shape := w.Shape
		if len(shape) == 0 {
			shape = []int{1} // scalars read as shape [1]
		}
		if !nn.SameShape(n.T.Shape(), shape) {
			t.Fatalf("%s: shape %v, PyTorch wrote %v", n.Name, n.T.Shape(), w.Shape)
		}
		for i, x := range nn.F32(n.T) {
			g := math.Float32bits(x)
			if g != w.Bits[i] && !(x != x && math.Float32frombits(w.Bits[i]) != math.Float32frombits(w.Bits[i])) {
				t.Fatalf("%s (%s)[%d]: read %08x, PyTorch has %08x", n.Name, w.DType, i, g, w.Bits[i])
			}
		}
	}
}
