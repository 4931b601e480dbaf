package data

import (
	"archive/zip"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// A user's data set in a file: a NumPy .npz archive or a safetensors file
// holding the inputs and the labels y, and optionally the same with a
// _test suffix (x_test, y_test). Without them the last HeldOut of the
// samples are the test split. The classes are the largest label + 1.
//
// The input is x, or x0, x1, ... for a model of several inputs (matched to
// its inputs by name). An input of float32, float64 or uint8 values (uint8
// scaled to [0, 1]) holds features; one of signed integers (int8 to int64)
// holds ids (token ids, categories) in [0, MaxID). The labels y are
// integers of shape [N] (a class a sample) or [N, T...] (a class a
// position, a language model's next tokens; -100, nn.IgnoreLabel, where a
// position takes no part, as PyTorch's ignore_index), or float32 or float64 values
// (a regression's targets, of the model output's shape; the set then has
// no classes).

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
func LoadFile(path string) (*Set, error) { return loadFile(path, nil) }

func loadFile(path string, open Opener) (*Set, error) {
	var arrays map[string]*array
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npz":
		arrays, err = readNPZ(path, open)
	case ".safetensors":
		arrays, err = readSafetensorsArrays(path, open)
	default:
		return nil, fmt.Errorf("data: %s: want a .npz or .safetensors file", path)
	}
	if err != nil {
		return nil, err
	}
	names := []string{"x"}
	if arrays["x"] == nil && arrays["x0"] != nil {
		names = nil
		for k := 0; arrays["x"+strconv.Itoa(k)] != nil; k++ {
			names = append(names, "x"+strconv.Itoa(k))
		}
	}
	train, err := fileSplit(path, arrays, names, "")
	if err != nil {
		return nil, err
	}
	var test *Split
	switch {
	case arrays[names[0]+"_test"] != nil || arrays["y_test"] != nil:
		if test, err = fileSplit(path, arrays, names, "_test"); err != nil {
			return nil, err
		}
		for k, a := range test.Inputs() {
			if b := train.Inputs()[k]; !nn.SameShape(a.Shape, b.Shape) || a.Int != b.Int {
				return nil, corrupt(path, "%s_test's samples have shape %v, %s's %v", b.Name, a.Shape, b.Name, b.Shape)
			}
		}
		if !nn.SameShape(test.LabelShape, train.LabelShape) {
			return nil, corrupt(path, "y_test's labels have shape %v, y's %v", test.LabelShape, train.LabelShape)
		}
	default:
		n := int(float64(train.N) * HeldOut)
		if n < 1 || train.N-n < 1 {
			return nil, corrupt(path, "%d samples: too few to hold out a test split (give x_test and y_test)", train.N)
		}
		train, test = cut(train, train.N-n)
	}
	if (train.Classes == 0) != (test.Classes == 0) {
		return nil, corrupt(path, "y and y_test differ: one holds classes (integers), the other values (floats)")
	}
	classes := max(train.Classes, test.Classes)
	if classes == 1 {
		return nil, corrupt(path, "every label is 0: want at least two classes")
	}
	train.Classes, test.Classes = classes, classes
	return &Set{Name: path, Train: train, Test: test, Classes: classes}, nil
}

// fileSplit makes a split from the input arrays names (with suffix) and
// the labels y.
func fileSplit(path string, arrays map[string]*array, names []string, suffix string) (*Split, error) {
	yn := "y" + suffix
	y := arrays[yn]
	if y == nil || arrays[names[0]+suffix] == nil {
		return nil, corrupt(path, "want arrays %q (samples) and %q (labels)", names[0]+suffix, yn)
	}
	if len(y.shape) < 1 || y.shape[0] == 0 {
		return nil, corrupt(path, "%s has shape %v: want [N] or [N, positions...]", yn, y.shape)
	}
	n := y.shape[0]
	s := &Split{N: n, LabelShape: append([]int{}, y.shape[1:]...)}
	for k, name := range names {
		xn := name + suffix
		x := arrays[xn]
		if x == nil {
			return nil, corrupt(path, "no array %q", xn)
		}
		if len(x.shape) < 2 || x.shape[0] != n {
			return nil, corrupt(path, "%s has shape %v and %s %v: want [N, sample shape...] and [N] (or [N, positions...])", xn, x.shape, yn, y.shape)
		}
		a := Array{Name: name, Shape: append([]int(nil), x.shape[1:]...), Int: x.isInt()}
		var err error
		if a.Int {
			a.X, err = x.ids(path + ": " + xn)
		} else {
			a.X, err = x.floats(path + ": " + xn)
		}
		if err != nil {
			return nil, err
		}
		if k == 0 {
			s.Name, s.Shape, s.X, s.Int = a.Name, a.Shape, a.X, a.Int
		} else {
			s.More = append(s.More, a)
		}
	}
	var err error
	if y.isFloat() {
		s.Y, err = y.floats(path + ": " + yn)
		return s, err
	}
	if s.Y, err = y.labels(path + ": " + yn); err != nil {
		return nil, err
	}
	for _, v := range s.Y {
		s.Classes = max(s.Classes, int(v)+1)
	}
	if s.Classes == 0 {
		return nil, corrupt(path, "every label of %s is %d: ignored", yn, nn.IgnoreLabel)
	}
	return s, nil
}

// cut splits s at sample k.
func cut(s *Split, k int) (*Split, *Split) {
	d, L := s.SampleSize(), s.Labels()
	a := &Split{N: k, Shape: s.Shape, X: s.X[:k*d], Name: s.Name, Int: s.Int, LabelShape: s.LabelShape, Y: s.Y[:k*L], Classes: s.Classes}
	b := &Split{N: s.N - k, Shape: s.Shape, X: s.X[k*d:], Name: s.Name, Int: s.Int, LabelShape: s.LabelShape, Y: s.Y[k*L:], Classes: s.Classes}
	for _, m := range s.More {
		e := nn.Size(m.Shape)
		a.More = append(a.More, Array{Name: m.Name, Shape: m.Shape, X: m.X[:k*e], Int: m.Int})
		b.More = append(b.More, Array{Name: m.Name, Shape: m.Shape, X: m.X[k*e:], Int: m.Int})
	}
	return a, b
}

// readNPZ reads the .npy arrays of a zip archive (stored or deflated, as
// numpy.savez and savez_compressed write them).
func readNPZ(path string, open Opener) (map[string]*array, error) {
	f, err := open.open(path)
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
func readSafetensorsArrays(path string, open Opener) (map[string]*array, error) {
	f, err := open.open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	b, err := io.ReadAll(f)
	f.Close()
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
