package job

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// targetsFile writes n samples of 24 features and y of shape [n, per...]:
// floats, or integers 0 to classes-1.
func targetsFile(t *testing.T, floats bool, classes int, per ...int) string {
	t.Helper()
	const n = 40
	x := nn.New(n, 24)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(math.Sin(float64(i)))
	}
	shape := append([]int{n}, per...)
	m := nn.Size(shape)
	var y tensorio.Entry
	if floats {
		v := nn.New(shape...)
		for i := range nn.F32(v) {
			nn.F32(v)[i] = float32(math.Cos(float64(i)))
		}
		var err error
		if y, err = tensorio.F32Entry("y", v); err != nil {
			t.Fatal(err)
		}
	} else {
		v := make([]int64, m)
		for i := range v {
			v[i] = int64(i % classes)
		}
		y = tensorio.I64Entry("y", v, shape...)
	}
	xe, err := tensorio.F32Entry("x", x)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "d.safetensors")
	if err := tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{xe, y}, nil); err != nil {
		t.Fatal(err)
	}
	return path
}

// Float targets train with the squared error unasked; a loss that cannot
// score the model's output against the data's y is refused, naming both.
func TestLossOfTheData(t *testing.T) {
	model := "../onnx/testdata/towers.onnx" // [N, 24] to [N, 5]
	for _, tc := range []struct {
		name, loss, model string
		floats            bool
		y                 []int
		classes           int    // of integer labels (0: 2)
		trains, err       string // the loss trained, or the error
	}{
		{"float targets", "", model, true, []int{5}, 0, nn.LossMSE, ""},
		{"targets with an axis of 1", "", model, true, []int{5, 1}, 0, nn.LossMSE, ""},
		{"binary labels as bce targets", nn.LossBCE, model, false, []int{5}, 0, nn.LossBCE, ""},
		{"class labels", "", model, false, nil, 0, nn.LossCE, ""},
		{"too many classes", "", model, false, []int{}, 7, "", "the model has 5 outputs; the data has 7 classes"},
		{"ce on floats", nn.LossCE, model, true, []int{5}, 0, "", "needs class labels"},
		{"wrong target shape", "", model, true, []int{4}, 0, "", "the model's output is [N, 5], the data's y is [N, 4]"},
		{"a zoo classifier on floats", "", "mlp32", true, []int{5}, 0, "", "mlp32 is a classifier"},
		{"unknown loss", "hinge", model, true, []int{5}, 0, "", `unknown loss "hinge"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := DefaultSpec()
			s.Model, s.Data, s.Loss, s.Batch, s.MicroBatches, s.Steps, s.Epochs = tc.model, targetsFile(t, tc.floats, max(tc.classes, 2), tc.y...), tc.loss, 8, 2, 3, 0
			c, err := Check(s)
			var j *Job
			if err == nil {
				j, err = c.Prepare()
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			res, err := j.TrainLocal(1, LocalHooks{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Loss != tc.trains || math.IsNaN(res.TestLoss) || res.TestLoss <= 0 || res.Perplexity != 0 {
				t.Fatalf("loss %q, test loss %v, perplexity %v; want %s", res.Loss, res.TestLoss, res.Perplexity, tc.trains)
			}
		})
	}
}

// Logits [N, classes, H, W] take a label a pixel (the classes on axis 1),
// unless the classes could as well be on the last axis.
func TestClassesOnAxis1(t *testing.T) {
	for _, tc := range []struct {
		output, y []int
		err       string
	}{
		{[]int{5, 6, 7}, []int{6, 7}, ""},
		{[]int{5, 6, 7}, []int{5, 6}, ""}, // the classes last: 7 of them
		{[]int{5, 6, 5}, []int{6, 5}, "could hold the 5 classes on axis 1 or on the last axis"},
		{[]int{3, 6, 7}, []int{6, 7}, "the model has 3 outputs; the data has 5 classes"},
		{[]int{5, 6, 7}, []int{7, 6}, "the model gives [5 6] labels a sample"},
	} {
		set := &data.Set{Classes: 5, Train: &data.Split{LabelShape: tc.y, Classes: 5}, Test: &data.Split{LabelShape: tc.y, Classes: 5}}
		md := built{output: tc.output, labels: tc.output[:len(tc.output)-1]}
		err := DefaultSpec().checkTargets(set, md)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("logits [N %v], y [N %v]: %v, want %q", tc.output, tc.y, err, tc.err)
		}
	}
}

// Labels -100 are ignored by the cross-entropy and refused by the other
// losses, which would take them for targets.
func TestIgnoredLabels(t *testing.T) {
	const n = 40
	x := nn.New(n, 24)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(math.Sin(float64(i)))
	}
	y := make([]int64, n)
	for i := range y {
		y[i] = int64(i % 2)
		if i%4 == 3 {
			y[i] = nn.IgnoreLabel
		}
	}
	xe, err := tensorio.F32Entry("x", x)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "d.safetensors")
	if err := tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{xe, tensorio.I64Entry("y", y, n)}, nil); err != nil {
		t.Fatal(err)
	}
	s := DefaultSpec()
	s.Model, s.Data, s.Batch, s.MicroBatches, s.Steps, s.Epochs = "../onnx/testdata/towers.onnx", path, 8, 2, 3, 0
	s.Loss = nn.LossBCE
	if _, err := mustCheck(t, s).Prepare(); err == nil || !strings.Contains(err.Error(), "labels -100, which only the loss ce ignores") {
		t.Fatalf("bce on ignored labels: %v", err)
	}
	s.Loss = ""
	j, err := mustCheck(t, s).Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := j.Targets(j.Set.Test.Y), j.Set.Test.N-1; got != want { // the test samples are 36-39
		t.Fatalf("%d test labels count, want %d", got, want)
	}
	res, err := j.TrainLocal(1, LocalHooks{})
	if err != nil || math.IsNaN(res.TestLoss) {
		t.Fatalf("%v, test loss %v", err, res.TestLoss)
	}
}

// Label smoothing is the cross-entropy's, in [0, 1).
func TestLabelSmoothingSpec(t *testing.T) {
	for _, tc := range []struct {
		loss      string
		smoothing float64
		floats    bool
		err       string
	}{
		{"", 0.1, false, ""},
		{"", 1, false, "label smoothing 1: want a value in [0, 1)"},
		{"", math.NaN(), false, "want a value in [0, 1)"},
		{nn.LossMSE, 0.1, true, "label smoothing is the ce loss's; the loss is mse"},
		{"", 0.1, true, "label smoothing is the ce loss's; float targets take mse"},
	} {
		s := DefaultSpec()
		s.Model, s.Data, s.Loss, s.LabelSmoothing, s.Batch, s.MicroBatches, s.Steps, s.Epochs = "../onnx/testdata/towers.onnx", targetsFile(t, tc.floats, 2, 5), tc.loss, tc.smoothing, 8, 2, 3, 0
		if !tc.floats {
			s.Data = targetsFile(t, false, 2)
		}
		c, err := Check(s)
		if err == nil {
			_, err = c.Prepare()
		}
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("loss %q, smoothing %v: %v, want %q", tc.loss, tc.smoothing, err, tc.err)
		}
	}
}

// Class weights are the cross-entropy's, one a class of the model's
// logits, from 0 up (with label smoothing too); under them the mean
// divides by the labels' weights.
func TestClassWeightsSpec(t *testing.T) {
	for _, tc := range []struct {
		weights   []float64
		floats    bool
		smoothing float64
		err       string
	}{
		{[]float64{1, 3, 1, 1, 1}, false, 0, ""}, // the model has 5 logits
		{[]float64{1, 2, 3}, false, 0, "3 class weights for a model of 5 classes"},
		{[]float64{1, -3}, false, 0, "class weight 1 is -3"},
		{[]float64{1, 3, 1, 1, 1}, false, 0.1, ""}, // with label smoothing
		{[]float64{1, 3, 1, 1, 1}, true, 0, "class weights are the ce loss's; float targets take mse"},
	} {
		s := DefaultSpec()
		s.Model, s.Data, s.ClassWeights, s.LabelSmoothing, s.Batch, s.MicroBatches, s.Steps, s.Epochs = "../onnx/testdata/towers.onnx", targetsFile(t, tc.floats, 2, 2), tc.weights, tc.smoothing, 8, 2, 3, 0
		if !tc.floats {
			s.Data = targetsFile(t, false, 2)
		}
		j, err := prepare(s)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("weights %v, smoothing %v: %v, want %q", tc.weights, tc.smoothing, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		y := j.Set.Train.Y[:8]
		var want float64
		for _, c := range y {
			want += tc.weights[int(c)]
		}
		if got := j.Mass(y); got != want || j.Targets(y) != 8 {
			t.Errorf("mass %v of labels %v, want %v; %d targets", got, y, want, j.Targets(y))
		}
	}
}
