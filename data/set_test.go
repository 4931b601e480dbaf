package data

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// checkSplit checks a 28x28x1, 10-class split of n samples against known
// statistics: the mean pixel (tolerance 0.002) and the first label.
func checkSplit(t *testing.T, name string, sp *Split, n int, mean float64, first float32) {
	t.Helper()
	if sp.N != n || sp.Classes != 10 || !slices.Equal(sp.Shape, []int{28, 28, 1}) {
		t.Fatalf("%s: %d samples, %d classes, shape %v; want %d, 10, [28 28 1]", name, sp.N, sp.Classes, sp.Shape, n)
	}
	if err := sp.Validate(); err != nil {
		t.Fatal(err)
	}
	var count [10]int
	for _, y := range sp.Y {
		count[int(y)]++
	}
	for c, k := range count {
		if k < sp.N/20 {
			t.Errorf("%s: class %d has %d of %d samples", name, c, k, sp.N)
		}
	}
	var sum float64
	for _, v := range sp.X {
		if v < 0 || v > 1 {
			t.Fatalf("%s: pixel %v outside [0, 1]", name, v)
		}
		sum += float64(v)
	}
	if m := sum / float64(len(sp.X)); m < mean-0.002 || m > mean+0.002 {
		t.Errorf("%s: mean pixel %.4f, want %.4f", name, m, mean)
	}
	if sp.Y[0] != first {
		t.Errorf("%s: first label %v, want %v", name, sp.Y[0], first)
	}
}

// checkStandard loads the MNIST-format set in dir through Load and checks
// both splits; under the race detector it checks only the test split, read
// directly, to stay fast.
func checkStandard(t *testing.T, name, dir string, trainMean, testMean float64, train0, test0 float32) {
	t.Helper()
	if raceEnabled {
		sp, err := ReadSplit(filepath.Join(dir, "t10k-images-idx3-ubyte.gz"), filepath.Join(dir, "t10k-labels-idx1-ubyte.gz"), 10)
		if err != nil {
			t.Fatal(err)
		}
		checkSplit(t, name+" test", sp, 10000, testMean, test0)
		t.Log("race detector on: checked the test split only")
		return
	}
	s, err := Load(name, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != name || s.Classes != 10 {
		t.Errorf("set %q with %d classes", s.Name, s.Classes)
	}
	checkSplit(t, name+" train", s.Train, 60000, trainMean, train0)
	checkSplit(t, name+" test", s.Test, 10000, testMean, test0)
}

func TestLoadMNIST(t *testing.T) {
	dir, err := MNISTDir()
	if err != nil {
		t.Skipf("MNIST files unavailable (needs the Go module proxy or %s): %v", MNISTDirEnv, err)
	}
	checkStandard(t, "mnist", dir, 0.1307, 0.1325, 5, 7)
}

func TestLoadFashionMNIST(t *testing.T) {
	if _, err := os.Stat(FashionMNISTDir); err != nil {
		t.Skipf("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): %v", err)
	}
	checkStandard(t, "fashion-mnist", FashionMNISTDir, 0.2860, 0.2868, 9, 9)
}

func TestLoadIDXDirMissing(t *testing.T) {
	_, err := LoadIDXDir(t.TempDir(), 10)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "train-images-idx3-ubyte") {
		t.Fatalf("err = %v, want ErrNotExist naming the file", err)
	}
	_, err = LoadFashionMNIST(t.TempDir())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want ErrNotExist", err)
	}
}

func TestLoadUnknown(t *testing.T) {
	if _, err := Load("cifar", Options{}); err == nil || !strings.Contains(err.Error(), "unknown data set") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseSynthetic(t *testing.T) {
	good := []struct {
		spec    string
		shape   []int
		classes int
	}{
		{"synthetic", []int{28, 28, 1}, 10},
		{"synthetic:32x32x3", []int{32, 32, 3}, 10},
		{"synthetic:32x32x3:100", []int{32, 32, 3}, 100},
		{"synthetic:784:2", []int{784}, 2},
	}
	for _, g := range good {
		shape, classes, err := ParseSynthetic(g.spec)
		if err != nil || !slices.Equal(shape, g.shape) || classes != g.classes {
			t.Errorf("%q: %v %d %v; want %v %d", g.spec, shape, classes, err, g.shape, g.classes)
		}
	}
	for _, bad := range []string{"synth", "synthetic:", "synthetic:32x:10", "synthetic:0x3", "synthetic:3x3:1",
		"synthetic:3x3:x", "synthetic:3:3:3", "synthetic:-1", "synthetic:99999999999999999999"} {
		if _, _, err := ParseSynthetic(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestSyntheticRejects(t *testing.T) {
	for _, c := range []struct {
		shape   []int
		classes int
		opt     Options
	}{
		{nil, 10, Options{}},
		{[]int{4, 0}, 10, Options{}},
		{[]int{4}, 1, Options{}},
		{[]int{4}, 10, Options{Train: -1}},
		{[]int{1 << 12, 1 << 12}, 10, Options{}},
		{[]int{1 << 10, 1 << 10}, 10, Options{Train: 1 << 9}},
		{[]int{4}, 10, Options{Noise: -1}},
	} {
		if _, err := Synthetic(c.shape, c.classes, c.opt); err == nil {
			t.Errorf("Synthetic(%v, %d, %+v) succeeded", c.shape, c.classes, c.opt)
		}
	}
}

func TestSynthetic(t *testing.T) {
	opt := Options{Seed: 7, Train: 500, Test: 200}
	s, err := Load("synthetic:8x8x2:10", opt)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "synthetic:8x8x2:10" || s.Classes != 10 || s.Train.N != 500 || s.Test.N != 200 || !slices.Equal(s.Test.Shape, []int{8, 8, 2}) {
		t.Fatalf("set %q classes %d train %d test %d shape %v", s.Name, s.Classes, s.Train.N, s.Test.N, s.Test.Shape)
	}
	for _, sp := range []*Split{s.Train, s.Test} {
		if err := sp.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, v := range sp.X {
			if v < 0 || v > 1 {
				t.Fatalf("value %v outside [0, 1]", v)
			}
		}
	}

	// Deterministic: bit for bit the same for the same seed, and sample i
	// does not depend on the sample counts.
	again, err := Synthetic([]int{8, 8, 2}, 10, Options{Seed: 7, Train: 100, Test: 300})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Train.X, s.Train.X[:len(again.Train.X)]) || !slices.Equal(again.Test.X[:len(s.Test.X)], s.Test.X) {
		t.Error("same seed gave different samples")
	}
	other, err := Synthetic([]int{8, 8, 2}, 10, Options{Seed: 8, Train: 100, Test: 100})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(other.Train.X, again.Train.X) {
		t.Error("different seeds gave the same samples")
	}

	// Learnable: a nearest-centroid classifier fit on train is far above
	// chance (0.1) on test.
	ss := s.Train.SampleSize()
	cent := make([]float64, s.Classes*ss)
	count := make([]int, s.Classes)
	for i, y := range s.Train.Y {
		count[int(y)]++
		for j, v := range s.Train.X[i*ss : (i+1)*ss] {
			cent[int(y)*ss+j] += float64(v)
		}
	}
	for c := range s.Classes {
		for j := range ss {
			cent[c*ss+j] /= float64(count[c])
		}
	}
	correct := 0
	for i, y := range s.Test.Y {
		best, bestD := -1, 0.0
		for c := range s.Classes {
			d := 0.0
			for j, v := range s.Test.X[i*ss : (i+1)*ss] {
				e := float64(v) - cent[c*ss+j]
				d += e * e
			}
			if best < 0 || d < bestD {
				best, bestD = c, d
			}
		}
		if float32(best) == y {
			correct++
		}
	}
	if acc := float64(correct) / float64(s.Test.N); acc < 0.8 {
		t.Errorf("nearest-centroid accuracy %.3f, want >= 0.8", acc)
	} else {
		t.Logf("nearest-centroid accuracy %.3f (chance 0.1)", acc)
	}
}
