package data

import (
	"archive/zip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// A user's data set in a file: a NumPy .npz archive or a safetensors file
// holding x (samples: float32, float64 or uint8, any sample shape; uint8
// is scaled to [0, 1]) and y (integer class labels), and optionally
// x_test and y_test. Without them the last HeldOut of the samples are the
// test split. The classes are the largest label + 1.

// HeldOut is the share of a file's samples kept for testing when it has no
// x_test and y_test.
const HeldOut = 0.1

// maxFileClasses bounds a file's labels.
const maxFileClasses = 1 << 16

// IsFile reports whether name is a data file path rather than a data set
// name.
func IsFile(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".npz" || ext == ".safetensors"
}

// LoadFile loads a data set from an .npz or .safetensors file.
func LoadFile(path string) (*Set, error) {
	var arrays map[string]*array
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npz":
		arrays, err = readNPZ(path)
	case ".safetensors":
		arrays, err = readSafetensorsArrays(path)
	default:
		return nil, fmt.Errorf("data: %s: want a .npz or .safetensors file", path)
	}
	if err != nil {
		return nil, err
	}
	train, err := fileSplit(path, arrays["x"], arrays["y"], "x", "y")
	if err != nil {
		return nil, err
	}
	var test *Split
	switch xt, yt := arrays["x_test"], arrays["y_test"]; {
	case xt != nil || yt != nil:
		if test, err = fileSplit(path, xt, yt, "x_test", "y_test"); err != nil {
			return nil, err
		}
		if !nn.SameShape(test.Shape, train.Shape) {
			return nil, corrupt(path, "x_test's samples have shape %v, x's %v", test.Shape, train.Shape)
		}
	default:
		n := int(float64(train.N) * HeldOut)
		if n < 1 || train.N-n < 1 {
			return nil, corrupt(path, "%d samples: too few to hold out a test split (give x_test and y_test)", train.N)
		}
		train, test = cut(train, train.N-n)
	}
	classes := max(train.Classes, test.Classes)
	if classes < 2 {
		return nil, corrupt(path, "every label is 0: want at least two classes")
	}
	train.Classes, test.Classes = classes, classes
	return &Set{Name: path, Train: train, Test: test, Classes: classes}, nil
}

// fileSplit makes a split from the samples x and labels y.
func fileSplit(path string, x, y *array, xn, yn string) (*Split, error) {
	if x == nil || y == nil {
		return nil, corrupt(path, "want arrays %q (samples) and %q (labels)", xn, yn)
	}
	if len(x.shape) < 2 || len(y.shape) != 1 || x.shape[0] != y.shape[0] || x.shape[0] == 0 {
		return nil, corrupt(path, "%s has shape %v and %s %v: want [N, sample shape...] and [N]", xn, x.shape, yn, y.shape)
	}
	xs, err := x.floats(path + ": " + xn)
	if err != nil {
		return nil, err
	}
	ys, err := y.labels(path + ": " + yn)
	if err != nil {
		return nil, err
	}
	s := &Split{N: x.shape[0], Shape: append([]int(nil), x.shape[1:]...), X: xs, Y: ys}
	for _, v := range ys {
		s.Classes = max(s.Classes, int(v)+1)
	}
	return s, nil
}

// cut splits s at sample k.
func cut(s *Split, k int) (*Split, *Split) {
	d := s.SampleSize()
	a := &Split{N: k, Shape: s.Shape, X: s.X[:k*d], Y: s.Y[:k], Classes: s.Classes}
	b := &Split{N: s.N - k, Shape: s.Shape, X: s.X[k*d:], Y: s.Y[k:], Classes: s.Classes}
	return a, b
}

// readNPZ reads the .npy arrays of a zip archive (stored or deflated, as
// numpy.savez and savez_compressed write them).
func readNPZ(path string) (map[string]*array, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return readNPZFrom(f, fi.Size(), path)
}

// readNPZFrom reads the arrays of an .npz archive of size bytes.
func readNPZFrom(r io.ReaderAt, size int64, path string) (map[string]*array, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, corrupt(path, "not an .npz archive: %v", err)
	}
	out := map[string]*array{}
	for _, f := range zr.File {
		name, ok := strings.CutSuffix(f.Name, ".npy")
		if !ok {
			continue
		}
		if f.UncompressedSize64 > 1<<40 {
			return nil, corrupt(path, "%s claims %d bytes", f.Name, f.UncompressedSize64)
		}
		rc, err := f.Open()
		if err != nil {
			return nil, corrupt(path, "%s: %v", f.Name, err)
		}
		a, err := readNPY(rc, int64(f.UncompressedSize64), path+": "+f.Name)
		rc.Close()
		if err != nil {
			return nil, err
		}
		out[name] = a
	}
	return out, nil
}

// readSafetensorsArrays reads the tensors of a safetensors file.
func readSafetensorsArrays(path string) (map[string]*array, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	entries, _, err := tensorio.ParseSafetensors(b)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", path, err)
	}
	out := map[string]*array{}
	for _, e := range entries {
		dt, ok := map[tensorio.DType]string{tensorio.F32: "f4", tensorio.F64: "f8", tensorio.U8: "u1",
			tensorio.I32: "i4", tensorio.I64: "i8"}[e.DType]
		if !ok {
			continue
		}
		out[e.Name] = &array{dtype: dt, shape: e.Shape, data: e.Data}
	}
	return out, nil
}
