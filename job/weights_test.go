package job_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx"
	"github.com/ppnode/ppnode/tensorio"
)

// prepare is job.Check, then Prepare.
func prepare(s job.Spec) (*job.Job, error) {
	c, err := job.Check(s)
	if err != nil {
		return nil, err
	}
	return c.Prepare()
}

// --init starts a job from a weights file (names and layouts of the
// PyTorch state_dict), whatever the seed; a file of another model, or of
// another size, is refused naming what differs.
func TestInitFromWeightsFile(t *testing.T) {
	spec := job.DefaultSpec()
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "vgg16", 0.125, "synthetic:8x8x3:4", 64
	spec.Batch, spec.MicroBatches, spec.Steps, spec.Seed = 16, 2, 1, 1
	a, err := prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	es, err := job.WeightsEntries(a.Graph.Params(), 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := tensorio.SaveSafetensorsEntries(path, es, nil); err != nil {
		t.Fatal(err)
	}
	spec.Seed, spec.Init = 2, path
	b, err := prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nn.WeightsSHA256(b.Graph.Params()), nn.WeightsSHA256(a.Graph.Params()); got != want {
		t.Errorf("started at weights %.16s, the file holds %.16s", got, want)
	}
	for _, c := range []struct {
		model string
		width float64
		want  []string
	}{
		{"mlp32", 16, []string{"not of this model", "lacks fc4.weight", "and 53 more", "has bn1.bias"}},
		{"vgg16", 0.25, []string{"conv1.weight: shape [8 3 3 3], want [16 3 3 3]", "another size"}},
	} {
		s := spec
		s.Model, s.Width = c.model, c.width
		_, err := prepare(s)
		if !errors.Is(err, job.ErrSpec) {
			t.Fatalf("%s width %v from vgg16 width 0.125's file: %v, want ErrSpec", c.model, c.width, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
	}
}

// towersCopy copies the towers ONNX model into dir and returns its path
// and bytes.
func towersCopy(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	model := filepath.Join(dir, "m.onnx")
	b, err := os.ReadFile("../onnx/testdata/towers.onnx")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(model, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return model, b
}

// A node whose file differs from the one the job was submitted with
// refuses the job.
func TestFilesChecked(t *testing.T) {
	dir := t.TempDir()
	model, b := towersCopy(t, dir)
	spec := job.DefaultSpec()
	spec.Model = model
	if err := spec.HashFiles(); err != nil || len(spec.Files) != 1 {
		t.Fatalf("HashFiles: %v, files %v", err, spec.Files)
	}
	if _, err := spec.BuildModel(job.Sample{Inputs: []onnx.Input{{Name: "x", Shape: []int{24}}}, Classes: 5}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(model, b[:len(b)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := spec.BuildModel(job.Sample{Inputs: []onnx.Input{{Name: "x", Shape: []int{24}}}, Classes: 5})
	if !errors.Is(err, job.ErrSpec) || !strings.Contains(err.Error(), "not the file the job was submitted with") {
		t.Errorf("a changed model file: %v", err)
	}
}
