package data

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ppnode/ppnode/nn"
	"io"
	"math"
	"strconv"
	"strings"
)

// array is an n-dimensional array read from a NumPy or safetensors file:
// its element type, shape and little-endian bytes.
type array struct {
	dtype string // "f4", "f8", "u1", "i1", "i2", "i4", "i8"
	shape []int
	data  []byte
}

// itemSize is the bytes of one element of dtype, or 0 if unsupported.
func itemSize(dtype string) int {
	switch dtype {
	case "u1", "i1":
		return 1
	case "i2":
		return 2
	case "f4", "i4":
		return 4
	case "f8", "i8":
		return 8
	}
	return 0
}

// maxElements bounds an array's element count (2^31: a data set of 8 GiB
// of float32).
const maxElements = 1 << 31

// elements is the element count of shape, or an error if it overflows
// maxElements or a dimension is negative.
func elements(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 || d > maxElements || n > maxElements/max(d, 1) {
			return 0, fmt.Errorf("shape %v is too large or negative", shape)
		}
		n *= d
	}
	return n, nil
}

// readNPY reads a .npy array of at most size bytes (version 1, 2 or 3;
// C order; little-endian or one-byte types). The header is checked
// against size before the data is allocated.
func readNPY(r io.Reader, size int64, name string) (*array, error) {
	a, err := readNPYHeader(r, size, name)
	if err != nil {
		return nil, err
	}
	n, _ := elements(a.shape)
	want := int64(n) * int64(itemSize(a.dtype))
	// Grow with the bytes that arrive: a compressed archive's sizes are
	// only claims.
	buf := bytes.NewBuffer(make([]byte, 0, min(want, 64<<20)))
	if _, err := io.CopyN(buf, r, want); err != nil {
		return nil, corrupt(name, "data: %v", err)
	}
	a.data = buf.Bytes()
	return a, nil
}

// readNPYHeader reads a .npy file's header: the array without its data.
func readNPYHeader(r io.Reader, size int64, name string) (*array, error) {
	var pre [10]byte
	if _, err := io.ReadFull(r, pre[:8]); err != nil {
		return nil, corrupt(name, "no NumPy header: %v", err)
	}
	if string(pre[:6]) != "\x93NUMPY" || pre[6] < 1 || pre[6] > 3 {
		return nil, corrupt(name, "not a .npy file of version 1 to 3 (no NumPy magic)")
	}
	var hlen int
	lenBytes := 4
	if pre[6] == 1 {
		lenBytes = 2
		if _, err := io.ReadFull(r, pre[8:10]); err != nil {
			return nil, corrupt(name, "header length: %v", err)
		}
		hlen = int(binary.LittleEndian.Uint16(pre[8:10]))
	} else {
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, corrupt(name, "header length: %v", err)
		}
		hlen = int(binary.LittleEndian.Uint32(b[:]))
	}
	if hlen > 1<<16 || int64(hlen) > size {
		return nil, corrupt(name, "header of %d bytes", hlen)
	}
	hdr := make([]byte, hlen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, corrupt(name, "header: %v", err)
	}
	a, err := parseNPYHeader(string(hdr))
	if err != nil {
		return nil, corrupt(name, "%v", err)
	}
	n, err := elements(a.shape)
	if err != nil {
		return nil, corrupt(name, "%v", err)
	}
	want := int64(n) * int64(itemSize(a.dtype))
	if rest := size - int64(8+lenBytes+hlen); want > rest {
		return nil, corrupt(name, "shape %v of %s needs %d bytes; the file has %d", a.shape, a.dtype, want, rest)
	}
	return a, nil
}

// parseNPYHeader parses the Python dict of a .npy header, as NumPy writes
// it: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
func parseNPYHeader(h string) (*array, error) {
	h = strings.TrimSpace(h)
	if !strings.HasPrefix(h, "{") || !strings.HasSuffix(h, "}") {
		return nil, errors.New("header is not a dict")
	}
	field := func(key string) (string, error) {
		i := strings.Index(h, "'"+key+"':")
		if i < 0 {
			return "", fmt.Errorf("header has no %s", key)
		}
		return strings.TrimSpace(h[i+len(key)+3:]), nil
	}
	descr, err := field("descr")
	if err != nil {
		return nil, err
	}
	end := strings.IndexByte(descr[min(1, len(descr)):], '\'')
	if !strings.HasPrefix(descr, "'") || end < 0 {
		return nil, errors.New("header has no quoted descr")
	}
	d := descr[1 : end+1]
	if len(d) != 3 || (d[0] != '<' && d[0] != '|') || itemSize(d[1:]) == 0 || d[0] == '|' && itemSize(d[1:]) != 1 {
		return nil, fmt.Errorf("dtype %q: want little-endian float32 or float64 samples, or uint8, int8, int16, int32 or int64", d)
	}
	fo, err := field("fortran_order")
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(fo, "False") {
		return nil, fmt.Errorf("Fortran-order arrays are not supported (save with np.ascontiguousarray)")
	}
	sh, err := field("shape")
	if err != nil {
		return nil, err
	}
	close := strings.IndexByte(sh, ')')
	if !strings.HasPrefix(sh, "(") || close < 0 {
		return nil, errors.New("header has no shape tuple")
	}
	a := &array{dtype: d[1:], shape: []int{}}
	for _, f := range strings.Split(sh[1:close], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("shape %q", sh[:close+1])
		}
		a.shape = append(a.shape, v)
	}
	return a, nil
}

// floats returns the array's elements as float32, scaling uint8 to [0, 1]
// as the IDX data sets are.
func (a *array) floats(name string) ([]float32, error) {
	n := len(a.data) / max(itemSize(a.dtype), 1)
	out := make([]float32, n)
	switch a.dtype {
	case "f4":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(a.data[4*i:]))
		}
	case "f8":
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(a.data[8*i:])))
		}
	case "u1":
		for i, b := range a.data {
			out[i] = float32(b) / 255
		}
	default:
		return nil, corrupt(name, "samples of type %s: want float32, float64 or uint8", a.dtype)
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, corrupt(name, "sample value %d is %v", i, v)
		}
	}
	return out, nil
}

// MaxID bounds the integers of an integer input (token ids, categories):
// they travel as exact float32 values.
const MaxID = 1 << 24

// isInt reports whether the array holds signed integers: ids, not pixels
// (uint8 arrays are pixels, scaled to [0, 1]).
func (a *array) isInt() bool {
	switch a.dtype {
	case "i1", "i2", "i4", "i8":
		return true
	}
	return false
}

// ids returns an integer array's elements as exact float32 values in
// [0, MaxID).
func (a *array) ids(name string) ([]float32, error) {
	return a.integers(name, "id", MaxID-1)
}

// labels returns the array's elements as class labels, or nn.IgnoreLabel.
func (a *array) labels(name string) ([]float32, error) {
	return a.integers(name, "label", maxFileClasses)
}

// isFloat reports whether the array holds floats: targets of a regression
// when it is the labels' array.
func (a *array) isFloat() bool { return a.dtype == "f4" || a.dtype == "f8" }

// integers returns an integer array's elements, each in [0, hi] (below
// 2^24, so exact as float32).
func (a *array) integers(name, what string, hi int64) ([]float32, error) {
	size := itemSize(a.dtype)
	out := make([]float32, len(a.data)/max(size, 1))
	for i := range out {
		var v int64
		b := a.data[size*i:]
		switch a.dtype {
		case "u1":
			v = int64(b[0])
		case "i1":
			v = int64(int8(b[0]))
		case "i2":
			v = int64(int16(binary.LittleEndian.Uint16(b)))
		case "i4":
			v = int64(int32(binary.LittleEndian.Uint32(b)))
		case "i8":
			v = int64(binary.LittleEndian.Uint64(b))
		default:
			return nil, corrupt(name, "%ss of type %s: want an integer type", what, a.dtype)
		}
		if (v < 0 || v > hi) && !(what == "label" && v == nn.IgnoreLabel) {
			return nil, corrupt(name, "%s %d at %d is not in [0, %d]", what, v, i, hi)
		}
		out[i] = float32(v)
	}
	return out, nil
}
