package data

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// writeNPZ writes arrays into an .npz archive (deflated if compress, as
// numpy.savez_compressed does).
func writeNPZ(t *testing.T, path string, arrays map[string]*array, compress bool) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for name, a := range arrays {
		method := zip.Store
		if compress {
			method = zip.Deflate
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name + ".npy", Method: method})
		if err != nil {
			t.Fatal(err)
		}
		if err := writeNPY(w, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// images is n uint8 samples of shape 4x4x1 whose label is their first
// pixel mod classes.
func images(n, classes int) (x, y *array) {
	x = &array{dtype: "u1", shape: []int{n, 4, 4, 1}, data: make([]byte, n*16)}
	y = &array{dtype: "i8", shape: []int{n}, data: make([]byte, 8*n)}
	for i := range n {
		for j := range 16 {
			x.data[16*i+j] = byte(7*i + j)
		}
		binary.LittleEndian.PutUint64(y.data[8*i:], uint64(int(x.data[16*i])%classes))
	}
	return x, y
}

func TestLoadNPZ(t *testing.T) {
	dir := t.TempDir()
	x, y := images(50, 3)
	for _, compress := range []bool{false, true} {
		path := filepath.Join(dir, "d.npz")
		writeNPZ(t, path, map[string]*array{"x": x, "y": y}, compress)
		set, err := Load(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if set.Train.N != 45 || set.Test.N != 5 || set.Classes != 3 || !nn.SameShape(set.Train.Shape, []int{4, 4, 1}) {
			t.Fatalf("compress %v: train %d, test %d, classes %d, shape %v; want 45, 5 (10%% held out), 3, [4 4 1]",
				compress, set.Train.N, set.Test.N, set.Classes, set.Train.Shape)
		}
		if err := set.Train.Validate(); err != nil {
			t.Fatal(err)
		}
		if got, want := set.Test.X[1], float32((7*45+1)%256)/255; got != want {
			t.Errorf("test sample 0 pixel 1 = %v, want %v (uint8 / 255)", got, want)
		}
	}
	// A separate test split.
	xt, yt := images(7, 3)
	path := filepath.Join(dir, "t.npz")
	writeNPZ(t, path, map[string]*array{"x": x, "y": y, "x_test": xt, "y_test": yt}, false)
	set, err := LoadFile(path)
	if err != nil || set.Train.N != 50 || set.Test.N != 7 {
		t.Fatalf("with x_test: %v, %+v", err, set)
	}
}

// safetensorsFile builds a safetensors file of the arrays by hand.
func safetensorsFile(t *testing.T, path string, arrays map[string]*array) {
	t.Helper()
	names := map[string]string{"f4": "F32", "f8": "F64", "u1": "U8", "i4": "I32", "i8": "I64"}
	hdr := map[string]any{}
	var data []byte
	for name, a := range arrays {
		hdr[name] = map[string]any{"dtype": names[a.dtype], "shape": a.shape, "data_offsets": []int{len(data), len(data) + len(a.data)}}
		data = append(data, a.data...)
	}
	h, _ := json.Marshal(hdr)
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(h)))
	b.Write(h)
	b.Write(data)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadSafetensors(t *testing.T) {
	n := 20
	x := &array{dtype: "f4", shape: []int{n, 6}, data: make([]byte, 4*6*n)}
	for i := range 6 * n {
		binary.LittleEndian.PutUint32(x.data[4*i:], math.Float32bits(float32(i)/10))
	}
	y := &array{dtype: "i4", shape: []int{n}, data: make([]byte, 4*n)}
	for i := range n {
		binary.LittleEndian.PutUint32(y.data[4*i:], uint32(i%4))
	}
	path := filepath.Join(t.TempDir(), "d.safetensors")
	safetensorsFile(t, path, map[string]*array{"x": x, "y": y})
	set, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if set.Train.N != 18 || set.Test.N != 2 || set.Classes != 4 || set.Train.X[7] != 0.7 {
		t.Fatalf("train %d, test %d, classes %d, x[7] %v", set.Train.N, set.Test.N, set.Classes, set.Train.X[7])
	}
}

// A float y holds a regression's targets: kept as they are, no classes.
func TestLoadTargets(t *testing.T) {
	x, _ := images(10, 2)
	y := &array{dtype: "f8", shape: []int{10, 3}, data: make([]byte, 8*30)}
	for i := range 30 {
		binary.LittleEndian.PutUint64(y.data[8*i:], math.Float64bits(float64(i)-7.5))
	}
	path := filepath.Join(t.TempDir(), "targets.npz")
	writeNPZ(t, path, map[string]*array{"x": x, "y": y}, false)
	set, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if set.Classes != 0 || !slices.Equal(set.Train.LabelShape, []int{3}) || set.Train.N != 9 || set.Test.Y[2] != 29-7.5 || set.Train.Y[0] != -7.5 {
		t.Fatalf("classes %d, label shape %v, train %d, test y %v", set.Classes, set.Train.LabelShape, set.Train.N, set.Test.Y)
	}
	if err := set.Train.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Bad files are refused with what is wrong, before anything their headers
// merely claim is allocated.
func TestBadDataFiles(t *testing.T) {
	dir := t.TempDir()
	x, y := images(10, 2)
	huge := &array{dtype: "f4", shape: []int{1 << 20, 1 << 10}, data: []byte{1, 2, 3, 4}}
	nanX := &array{dtype: "f4", shape: []int{10, 1}, data: make([]byte, 40)}
	binary.LittleEndian.PutUint32(nanX.data, math.Float32bits(float32(math.NaN())))
	negY := &array{dtype: "i8", shape: []int{10}, data: bytes.Repeat([]byte{0xff}, 80)}
	for _, tc := range []struct {
		name   string
		arrays map[string]*array
		want   string
	}{
		{"no labels", map[string]*array{"x": x}, `want arrays "x" (samples) and "y" (labels)`},
		{"lengths differ", map[string]*array{"x": x, "y": {dtype: "i8", shape: []int{9}, data: make([]byte, 72)}}, "want [N, sample shape...] and [N]"},
		{"claims 4 GiB", map[string]*array{"x": huge, "y": y}, "needs 4294967296 bytes"},
		{"NaN sample", map[string]*array{"x": nanX, "y": y}, "is NaN"},
		{"negative label", map[string]*array{"x": x, "y": negY}, "label -1"},
		{"NaN target", map[string]*array{"x": x, "y": nanX}, "is NaN"},
		{"every label ignored", map[string]*array{"x": x, "y": {dtype: "i8", shape: []int{10}, data: bytes.Repeat([]byte{0x9c, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 10)}}, "every label of y is -100"},
		{"targets and classes", map[string]*array{"x": x, "y": {dtype: "f4", shape: []int{10}, data: make([]byte, 40)}, "x_test": x, "y_test": y}, "one holds classes (integers), the other values (floats)"},
		{"one class", map[string]*array{"x": x, "y": {dtype: "i8", shape: []int{10}, data: make([]byte, 80)}}, "at least two classes"},
	} {
		path := filepath.Join(dir, "bad.npz")
		writeNPZ(t, path, tc.arrays, false)
		_, err := LoadFile(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if tc.name != "one class" && tc.name != "no labels" && tc.name != "lengths differ" && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v does not wrap ErrCorrupt", tc.name, err)
		}
	}
	for _, h := range []string{
		"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
		"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
		"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
		"not a dict",
	} {
		if _, err := parseNPYHeader(h); err == nil {
			t.Errorf("header %q accepted", h)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "x.npz"), []byte("not a zip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(filepath.Join(dir, "x.npz")); err == nil {
		t.Error("a file that is not a zip was accepted")
	}
}

// FuzzReadNPY: whatever the bytes, readNPY returns an array whose data
// matches its shape, or an error; it allocates no more than the input.
func FuzzReadNPY(f *testing.F) {
	x, y := images(3, 2)
	for _, a := range []*array{x, y} {
		var b bytes.Buffer
		writeNPY(&b, a)
		f.Add(b.Bytes())
		f.Add(b.Bytes()[:b.Len()-1])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := readNPY(bytes.NewReader(b), int64(len(b)), "fuzz")
		if err != nil {
			return
		}
		n, err := elements(a.shape)
		if err != nil || len(a.data) != n*itemSize(a.dtype) || len(a.data) > len(b) {
			t.Fatalf("shape %v of %s with %d bytes from %d", a.shape, a.dtype, len(a.data), len(b))
		}
	})
}

// FuzzReadNPZ: whatever the bytes, readNPZFrom returns arrays whose data
// match their shapes, or an error; it never allocates what the archive only
// claims (a stored entry's data is no larger than the input).
func FuzzReadNPZ(f *testing.F) {
	x, y := images(3, 2)
	for _, deflate := range []bool{false, true} {
		var b bytes.Buffer
		zw := zip.NewWriter(&b)
		for name, a := range map[string]*array{"x": x, "y": y} {
			method := zip.Store
			if deflate {
				method = zip.Deflate
			}
			w, _ := zw.CreateHeader(&zip.FileHeader{Name: name + ".npy", Method: method})
			writeNPY(w, a)
		}
		zw.Close()
		f.Add(b.Bytes())
		f.Add(b.Bytes()[:b.Len()/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		arrays, err := readNPZFrom(bytes.NewReader(b), int64(len(b)), "fuzz.npz")
		if err != nil {
			return
		}
		for name, a := range arrays {
			n, err := elements(a.shape)
			if err != nil || len(a.data) != n*itemSize(a.dtype) {
				t.Fatalf("%s: shape %v of %s with %d bytes", name, a.shape, a.dtype, len(a.data))
			}
		}
	})
}

// writeNPY writes a as a version 1.0 .npy file .
func writeNPY(w io.Writer, a *array) error {
	dims := make([]string, len(a.shape))
	for i, d := range a.shape {
		dims[i] = strconv.Itoa(d)
	}
	shape := strings.Join(dims, ", ")
	if len(dims) == 1 {
		shape += ","
	}
	order := "<"
	if itemSize(a.dtype) == 1 {
		order = "|"
	}
	h := fmt.Sprintf("{'descr': '%s%s', 'fortran_order': False, 'shape': (%s), }", order, a.dtype, shape)
	pad := 64 - (10+len(h)+1)%64
	h += strings.Repeat(" ", pad%64) + "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY\x01\x00")
	binary.Write(&b, binary.LittleEndian, uint16(len(h)))
	b.WriteString(h)
	b.Write(a.data)
	_, err := w.Write(b.Bytes())
	return err
}
