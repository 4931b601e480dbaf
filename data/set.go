package data

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
)

// Split is one part (train or test) of a data set.
type Split struct {
	N     int       // number of samples
	Shape []int     // per-sample shape of the first input, NHWC for images: [H, W, C]
	X     []float32 // N*SampleSize() values of the first input, sample after sample
	// Name names the first input ("x" when empty); Int says it holds
	// integers (token ids, categories) rather than features.
	Name string
	Int  bool
	// More are a multi-input model's further inputs, of N samples each.
	More []Array
	// LabelShape is the per-sample shape of Y: [] for one label a sample,
	// [T] for one a position (a language model's next tokens), or a
	// regression's target shape.
	LabelShape []int
	// Y holds N*Size(LabelShape) labels: classes in [0, Classes), exact as
	// float32, or nn.IgnoreLabel (a position the loss skips); or a
	// regression's target values when Classes is 0.
	Y       []float32
	Classes int // number of classes; 0 when Y holds values
}

// Array is one input of a split: N samples of one shape.
type Array struct {
	Name  string
	Shape []int
	X     []float32
	// Int marks integers (token ids, categories), held exactly as float32
	// values below MaxID.
	Int bool
}

// Inputs returns every input of the split, the first included.
func (s *Split) Inputs() []Array {
	name := s.Name
	if name == "" {
		name = "x"
	}
	return append([]Array{{Name: name, Shape: s.Shape, X: s.X, Int: s.Int}}, s.More...)
}

// input returns input k's shape and values without allocating.
func (s *Split) input(k int) ([]int, []float32) {
	if k == 0 {
		return s.Shape, s.X
	}
	return s.More[k-1].Shape, s.More[k-1].X
}

// Labels is the number of labels per sample.
func (s *Split) Labels() int { return nn.Size(s.LabelShape) }

// Set is a data set: a train and a test split of the same sample shape and
// classes.
type Set struct {
	Name        string
	Train, Test *Split
	Classes     int
}

// SampleSize is the number of values in one sample of the first input.
func (s *Split) SampleSize() int { return nn.Size(s.Shape) }

// Validate checks that the split is consistent: sizes agree, every label
// is in [0, Classes) and every id an integer in [0, MaxID).
func (s *Split) Validate() error {
	if s.N <= 0 || s.Classes < 0 || len(s.Shape) == 0 {
		return fmt.Errorf("data: split has N=%d, Classes=%d, shape %v", s.N, s.Classes, s.Shape)
	}
	for _, a := range s.Inputs() {
		for _, d := range a.Shape {
			if d <= 0 {
				return fmt.Errorf("data: split has sample shape %v", a.Shape)
			}
		}
		if len(a.Shape) == 0 || len(a.X) != s.N*nn.Size(a.Shape) {
			return fmt.Errorf("data: split of %d samples of shape %v has %d values of %s", s.N, a.Shape, len(a.X), a.Name)
		}
		if a.Int {
			for i, v := range a.X {
				if v != float32(int32(v)) || v < 0 || v >= MaxID {
					return fmt.Errorf("data: split: %s's value %v at %d is not an id in [0, %d)", a.Name, v, i, MaxID)
				}
			}
		}
	}
	for _, d := range s.LabelShape {
		if d <= 0 {
			return fmt.Errorf("data: split has label shape %v", s.LabelShape)
		}
	}
	if len(s.Y) != s.N*s.Labels() {
		return fmt.Errorf("data: split of %d samples of shape %v has %d labels of shape %v", s.N, s.Shape, len(s.Y), s.LabelShape)
	}
	for i, y := range s.Y {
		switch {
		case s.Classes == 0 && (math.IsNaN(float64(y)) || math.IsInf(float64(y), 0)):
			return fmt.Errorf("data: split: target %v of sample %d is not finite", y, i/max(s.Labels(), 1))
		case s.Classes > 0 && (y != float32(int32(y)) || y < 0 || int(y) >= s.Classes) && y != nn.IgnoreLabel:
			return fmt.Errorf("data: split: label %v of sample %d is not in [0, %d) (nor %d, ignored)", y, i/max(s.Labels(), 1), s.Classes, nn.IgnoreLabel)
		}
	}
	return nil
}

// SplitFromIDX builds a split from an images file ([N, H, W], magic
// 0x00000803) and a labels file ([N], magic 0x00000801). Pixels are scaled to
// [0, 1] by x/255; samples have shape [H, W, 1]. The files must agree in N and
// every label must be below classes; errors name the file and wrap ErrCorrupt.
func SplitFromIDX(images, labels *IDX, classes int) (*Split, error) {
	if classes <= 0 || classes > 256 {
		return nil, fmt.Errorf("data: %d classes for unsigned-byte labels", classes)
	}
	if len(images.Dims) != 3 {
		return nil, corrupt(images.Name, "images file has magic 0x%08x (%d dimensions), want 0x%08x ([N, H, W])", images.Magic(), len(images.Dims), IDXImagesMagic)
	}
	if len(labels.Dims) != 1 {
		return nil, corrupt(labels.Name, "labels file has magic 0x%08x (%d dimensions), want 0x%08x ([N])", labels.Magic(), len(labels.Dims), IDXLabelsMagic)
	}
	for _, m := range []*IDX{images, labels} {
		if nn.Size(m.Dims) != len(m.Data) {
			return nil, corrupt(m.Name, "dimensions %v need %d bytes, have %d", m.Dims, nn.Size(m.Dims), len(m.Data))
		}
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, corrupt(labels.Name, "count mismatch: %d labels for %d images in %s", labels.Dims[0], n, images.Name)
	}
	y := make([]float32, n)
	for i, b := range labels.Data {
		if int(b) >= classes {
			return nil, corrupt(labels.Name, "label %d of sample %d is out of range: want < %d classes", b, i, classes)
		}
		y[i] = float32(b)
	}
	var scale [256]float32
	for i := range scale {
		scale[i] = float32(i) / 255
	}
	x := make([]float32, len(images.Data))
	for i, b := range images.Data {
		x[i] = scale[b]
	}
	return &Split{N: n, Shape: []int{images.Dims[1], images.Dims[2], 1}, X: x, Y: y, Classes: classes}, nil
}

// ReadSplit reads a split from an images and a labels IDX file.
func ReadSplit(imagesPath, labelsPath string, classes int) (*Split, error) {
	images, err := ReadIDXFile(imagesPath)
	if err != nil {
		return nil, err
	}
	labels, err := ReadIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	return SplitFromIDX(images, labels, classes)
}

// idxPath finds base or base.gz in dir.
func idxPath(dir, base string) (string, error) {
	for _, name := range []string{base + ".gz", base} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("data: neither %s nor %s.gz in %s: %w", base, base, dir, fs.ErrNotExist)
}

// LoadIDXDir loads a set from the four MNIST-style files in dir:
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
// and t10k-labels-idx1-ubyte, each raw or with a .gz suffix (the content
// decides whether it is decompressed).
func LoadIDXDir(dir string, classes int) (*Set, error) {
	var paths [4]string
	for i, base := range []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
		p, err := idxPath(dir, base)
		if err != nil {
			return nil, err
		}
		paths[i] = p
	}
	train, err := ReadSplit(paths[0], paths[1], classes)
	if err != nil {
		return nil, err
	}
	test, err := ReadSplit(paths[2], paths[3], classes)
	if err != nil {
		return nil, err
	}
	if !reflect.DeepEqual(train.Shape, test.Shape) {
		return nil, corrupt(paths[2], "test images have shape %v, train images (%s) %v", test.Shape, paths[0], train.Shape)
	}
	return &Set{Name: dir, Train: train, Test: test, Classes: classes}, nil
}

// Options tune Load.
type Options struct {
	// Seed drives the synthetic generator.
	Seed uint64
	// Dir is a directory holding the four IDX files; for mnist and
	// fashion-mnist it overrides the default location.
	Dir string
	// Train and Test are the synthetic sample counts; 0 means
	// DefaultSyntheticTrain and DefaultSyntheticTest.
	Train, Test int
	// Noise is the amplitude of the synthetic noise; 0 means
	// DefaultSyntheticNoise.
	Noise float32
	// Open opens a data file (nil: os.Open).
	Open Opener
}

// An Opener opens a file by its path, for example inside a directory only.
type Opener func(path string) (*os.File, error)

func (o Opener) open(path string) (*os.File, error) {
	if o == nil {
		return os.Open(path)
	}
	return o(path)
}

// Load returns the named data set: "mnist", "fashion-mnist",
// "synthetic[:HxWxC[:classes]]" or a file (LoadFile) (for example "synthetic:32x32x3:10"; the
// shape may have any number of dimensions, "synthetic:784:10" is flat).
func Load(name string, opt Options) (*Set, error) {
	switch {
	case IsFile(name):
		return loadFile(name, opt.Open)
	case name == "mnist":
		return LoadMNIST(opt.Dir)
	case name == "fashion-mnist":
		return LoadFashionMNIST(opt.Dir)
	case name == "synthetic" || strings.HasPrefix(name, "synthetic:"):
		shape, classes, err := ParseSynthetic(name)
		if err != nil {
			return nil, err
		}
		return Synthetic(shape, classes, opt)
	}
	return nil, fmt.Errorf("data: unknown data set %q: want mnist, fashion-mnist, synthetic[:HxWxC[:classes]], or a .npz or .safetensors file", name)
}

// ParseSynthetic parses "synthetic[:D0xD1x...[:classes]]"; the defaults are
// shape 28x28x1 and 10 classes.
func ParseSynthetic(spec string) (shape []int, classes int, err error) {
	bad := func(why string) error {
		return fmt.Errorf("data: bad synthetic spec %q: %s (want synthetic[:HxWxC[:classes]], e.g. synthetic:32x32x3:10)", spec, why)
	}
	parts := strings.Split(spec, ":")
	if parts[0] != "synthetic" || len(parts) > 3 {
		return nil, 0, bad("malformed")
	}
	shape, classes = []int{28, 28, 1}, 10
	if len(parts) >= 2 {
		shape = shape[:0]
		for _, f := range strings.Split(parts[1], "x") {
			d, err := strconv.Atoi(f)
			if err != nil || d <= 0 || d > maxSyntheticSample {
				return nil, 0, bad(fmt.Sprintf("dimension %q is not an integer in [1, %d]", f, maxSyntheticSample))
			}
			shape = append(shape, d)
		}
	}
	if len(parts) == 3 {
		c, err := strconv.Atoi(parts[2])
		if err != nil || c < 2 || c > maxSyntheticClasses {
			return nil, 0, bad(fmt.Sprintf("classes %q is not an integer in [2, %d]", parts[2], maxSyntheticClasses))
		}
		classes = c
	}
	return shape, classes, nil
}

// EvalChunks is the number of chunks of size samples that cover the split;
// the last may be shorter.
func (s *Split) EvalChunks(size int) int {
	if size <= 0 {
		panic(fmt.Sprintf("data: eval chunk size %d", size))
	}
	return (s.N + size - 1) / size
}

// EvalChunk fills b with chunk i of the split in its stored order:
// samples [i*size, min((i+1)*size, N)).
func (s *Split) EvalChunk(i, size int, b *nn.Batch) {
	if i < 0 || i >= s.EvalChunks(size) {
		panic(fmt.Sprintf("data: eval chunk %d out of range [0, %d)", i, s.EvalChunks(size)))
	}
	lo, hi := i*size, min((i+1)*size, s.N)
	s.buffers(hi-lo, b)
	L := s.Labels()
	for k := range b.X {
		shape, x := s.input(k)
		ss := nn.Size(shape)
		copy(nn.F32(b.X[k]), x[lo*ss:hi*ss])
	}
	copy(b.Y, s.Y[lo*L:hi*L])
}

// Gather fills b with the samples idx, reusing its tensors where they fit
// and reallocating them otherwise.
func (s *Split) Gather(idx []int32, b *nn.Batch) {
	s.buffers(len(idx), b)
	for k := range b.X {
		xd := nn.F32(b.X[k])
		shape, x := s.input(k)
		ss := nn.Size(shape)
		for j, i := range idx {
			copy(xd[j*ss:(j+1)*ss], x[int(i)*ss:(int(i)+1)*ss])
		}
	}
	L := s.Labels()
	for j, i := range idx {
		copy(b.Y[j*L:(j+1)*L], s.Y[int(i)*L:(int(i)+1)*L])
	}
}

// buffers sizes b for n samples, reusing its tensors when they fit.
func (s *Split) buffers(n int, b *nn.Batch) {
	ins := 1 + len(s.More)
	for len(b.X) < ins {
		b.X = append(b.X, nil)
	}
	b.X = b.X[:ins]
	for k := range b.X {
		shape, _ := s.input(k)
		if !fits(n, shape, b.X[k]) {
			full := make([]int, 1+len(shape))
			full[0] = n
			copy(full[1:], shape)
			b.X[k] = nn.New(full...)
		}
	}
	L := n * s.Labels()
	if cap(b.Y) < L {
		b.Y = make([]float32, L)
	}
	b.Y = b.Y[:L]
}

// fits reports whether x is a float32, non-view tensor of shape [n, shape...].
func fits(n int, shape []int, x *nn.Tensor) bool {
	if x == nil || x.IsView() || x.Dtype().Kind() != reflect.Float32 {
		return false
	}
	sh := x.Shape()
	if len(sh) != 1+len(shape) || sh[0] != n {
		return false
	}
	for i, d := range shape {
		if sh[1+i] != d {
			return false
		}
	}
	return len(nn.F32(x)) == n*nn.Size(shape)
}
