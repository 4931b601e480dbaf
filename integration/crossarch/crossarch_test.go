// Package crossarch checks the promise of --deterministic across
// architectures: training on arm64 gives the weights of training on amd64,
// bit for bit. The test cross-compiles itself for arm64 (GOARCH=arm64 go
// test -c) and runs that binary under qemu-user (Debian's qemu-user-static)
// next to the same training in this process.
//
// mlp32 (20 steps, width 64) takes 15-20 s under qemu on a 2-core machine
// (about 40 s with the cross-compilation) and runs unless -short, as do
// the GPT, LSTM, GRU and RNN of onnx/testdata (a second each), and a tied
// GPT with AdamW, clipping, label smoothing and ignored labels, a model
// under the Huber error, an LSTM with class weights and label smoothing,
// AdamW without decay for its biases and a linear decay, and a model under
// the binary cross-entropy with a weight for its positives; resnet50
// (width 0.25, batch 16, 5 steps) takes 7-8 minutes there and runs with
// PPNODE_CROSSARCH_RESNET=1.
package crossarch

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// trainCase is a deterministic run, as `ppnode train --local
// --deterministic` with these flags would do it. data, if set, writes the
// run's data file into a directory both sides share and returns its path.
type trainCase struct {
	name  string
	flags string // for the report
	spec  func() job.Spec
	data  func(dir string) (string, error)
	slow  bool
}

// onnxCase trains one of onnx/testdata's models (exported from PyTorch:
// softmax and GELU in the GPT, sigmoid and tanh in the recurrent cells) for
// 20 steps on a data file of 96 samples that data writes.
func onnxCase(name string, data func(dir string) (string, error)) trainCase {
	return trainCase{
		name:  name,
		flags: "--model onnx/testdata/" + name + ".onnx --batch 12 --steps 20",
		spec: func() job.Spec {
			s := job.DefaultSpec()
			s.Model, s.Batch, s.MicroBatches, s.Steps, s.Epochs = "../../onnx/testdata/"+name+".onnx", 12, 1, 20, 0
			return s
		},
		data: data,
	}
}

// tokens writes 96 windows of 6 tokens below 5 and the next tokens.
func tokens(dir string) (string, error) {
	ids := make([]int64, 97*6)
	for i := range ids {
		ids[i] = int64(i*i%7) % 5
	}
	path := filepath.Join(dir, "tokens.safetensors")
	return path, tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{
		tensorio.I64Entry("x", ids[:96*6], 96, 6), tensorio.I64Entry("y", ids[6:], 96, 6)}, nil)
}

// sequences writes 96 sequences of 5 steps of 3 features, labels below 5.
func sequences(dir string) (string, error) {
	x := nn.New(96, 5, 3)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(math.Sin(float64(i)*0.7)) * 2
	}
	y := make([]int64, 96)
	for i := range y {
		y[i] = int64(i % 5)
	}
	xe, err := tensorio.F32Entry("x", x)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "sequences.safetensors")
	return path, tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{xe, tensorio.I64Entry("y", y, 96)}, nil)
}

var cases = []trainCase{
	{
		name:  "mlp32",
		flags: "--model mlp32 --width 64 --data synthetic:28x28x1:10 --synthetic-samples 512 --steps 20",
		spec: func() job.Spec {
			s := job.DefaultSpec()
			s.Model, s.Width, s.Data, s.SyntheticSamples, s.Steps = "mlp32", 64, "synthetic:28x28x1:10", 512, 20
			s.Epochs = 0 // --steps alone: exactly 20 steps (with 3 epochs, 12)
			return s
		},
	},
	{
		name:  "resnet50",
		flags: "--model resnet50 --width 0.25 --data synthetic:32x32x3:10 --synthetic-samples 64 --batch 16 --steps 5",
		spec: func() job.Spec {
			s := job.DefaultSpec()
			s.Model, s.Width, s.Data, s.SyntheticSamples, s.Batch, s.Steps = "resnet50", 0.25, "synthetic:32x32x3:10", 64, 16, 5
			s.Epochs = 0
			return s
		},
		slow: true,
	},
	onnxCase("gpt", tokens),
	onnxCase("lstm", sequences),
	onnxCase("gru", sequences),
	onnxCase("rnn", sequences),
	// The training options of this wave's models: AdamW, clipped
	// gradients (a tied tensor once), label smoothing, ignored labels; the
	// Huber error against float targets.
	withSpec(onnxCase("tiedgpt", paddedTokens), "tiedgpt-adamw", " --optimizer adamw --weight-decay 0.1 --clip-grad-norm 0.05 --label-smoothing 0.1", func(s *job.Spec) {
		s.Optimizer, s.WeightDecay, s.ClipGradNorm, s.LabelSmoothing = "adamw", 0.1, 0.05, 0.1
	}),
	withSpec(onnxCase("towers", targets), "towers-huber", " --loss huber", func(s *job.Spec) { s.Loss = nn.LossHuber }),
	// Class weights with label smoothing, AdamW without decay for the
	// biases, a linear decay to a floor; the binary cross-entropy with a
	// weight for its positives.
	withSpec(onnxCase("lstm", sequences), "lstm-weighted",
		" --class-weights 0.5,2,1,0.25,1.5 --label-smoothing 0.1 --optimizer adamw --weight-decay 0.1 --no-decay-1d --lr-schedule linear --min-lr 1e-4", func(s *job.Spec) {
			s.ClassWeights, s.LabelSmoothing = []float64{0.5, 2, 1, 0.25, 1.5}, 0.1
			s.Optimizer, s.WeightDecay, s.NoDecay1D, s.LRSchedule, s.MinLR = "adamw", 0.1, true, "linear", 1e-4
		}),
	withSpec(onnxCase("towers", clicks), "towers-bce", " --loss bce --pos-weight 3,1,2,0.5,4", func(s *job.Spec) {
		s.Loss, s.PosWeight = nn.LossBCE, []float64{3, 1, 2, 0.5, 4}
	}),
}

// withSpec is c named name, its spec changed by f, as flags say.
func withSpec(c trainCase, name, flags string, f func(*job.Spec)) trainCase {
	spec := c.spec
	c.name, c.flags = name, c.flags+flags
	c.spec = func() job.Spec {
		s := spec()
		f(&s)
		return s
	}
	return c
}

// paddedTokens is tokens with the labels of each window's tail from a
// varying length on ignored (-100).
func paddedTokens(dir string) (string, error) {
	ids := make([]int64, 97*6)
	for i := range ids {
		ids[i] = int64(i*i%7) % 5
	}
	y := append([]int64(nil), ids[6:]...)
	for w := range 96 {
		for p := 1 + w%6; p < 6; p++ {
			y[w*6+p] = nn.IgnoreLabel
		}
	}
	path := filepath.Join(dir, "padded.safetensors")
	return path, tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{
		tensorio.I64Entry("x", ids[:96*6], 96, 6), tensorio.I64Entry("y", y, 96, 6)}, nil)
}

// targets writes 96 samples of 24 features and 5 float targets each.
func targets(dir string) (string, error) {
	return floatTargets(dir, "targets", func(i int) float32 { return 3 * float32(math.Cos(float64(i)*0.9)) })
}

// clicks writes 96 samples of 24 features and 5 targets each of 0 or 1,
// a quarter of them 1.
func clicks(dir string) (string, error) {
	return floatTargets(dir, "clicks", func(i int) float32 {
		if math.Cos(float64(i)*0.9) > 0.7 {
			return 1
		}
		return 0
	})
}

// floatTargets writes dir/name.safetensors: 96 samples of 24 features,
// and 5 float targets each, target i of them y(i).
func floatTargets(dir, name string, y func(i int) float32) (string, error) {
	x, t := nn.New(96, 24), nn.New(96, 5)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(math.Sin(float64(i) * 0.3))
	}
	for i := range nn.F32(t) {
		nn.F32(t)[i] = y(i)
	}
	xe, err := tensorio.F32Entry("x", x)
	if err != nil {
		return "", err
	}
	ye, err := tensorio.F32Entry("y", t)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".safetensors")
	return path, tensorio.SaveSafetensorsEntries(path, []tensorio.Entry{xe, ye}, nil)
}

// weightsSHA trains c as TrainLocal does, without the evaluation on the
// test split that the fingerprint does not depend on (it would be most of
// the time under qemu), and returns the weights' fingerprint.
func weightsSHA(c trainCase, threads int, dir string) (string, error) {
	s := c.spec()
	s.Deterministic, s.Threads = true, threads
	if c.data != nil {
		var err error
		if s.Data, err = c.data(dir); err != nil {
			return "", err
		}
	}
	cs, err := job.Check(s)
	if err != nil {
		return "", err
	}
	j, err := cs.Prepare()
	if err != nil {
		return "", err
	}
	be, err := j.Spec.NewBackend(threads)
	if err != nil {
		return "", err
	}
	opt, err := j.Spec.NewOptimizer(be.Threads())
	if err != nil {
		return "", err
	}
	tr := j.NewTrainer(opt, be)
	for g := 0; g < j.Total; g++ {
		opt.SetLR(j.LR.At(g))
		r := tr.Step(j.Loader, g/j.StepsPerEpoch, g%j.StepsPerEpoch, g)
		if err := job.CheckLoss(g, r.Loss); err != nil {
			return "", err
		}
	}
	return nn.WeightsSHA256(j.Graph.Params()), nil
}

const (
	workerEnv = "PPNODE_CROSSARCH_CASE"
	dataEnv   = "PPNODE_CROSSARCH_DATA" // the directory of the cases' data files
)

// TestWorker is what the arm64 binary runs: it prints the fingerprint of
// the case named by $PPNODE_CROSSARCH_CASE.
func TestWorker(t *testing.T) {
	name := os.Getenv(workerEnv)
	if name == "" {
		t.Skip("the arm64 side of TestArm64WeightsAreAmd64Weights")
	}
	for _, c := range cases {
		if c.name == name {
			sha, err := weightsSHA(c, 2, os.Getenv(dataEnv))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("weights_sha256 %s %s\n", runtime.GOARCH, sha)
			return
		}
	}
	t.Fatalf("no case %q", name)
}

// qemu finds qemu-user for aarch64.
func qemu() (string, error) {
	for _, name := range []string{"qemu-aarch64-static", "qemu-aarch64"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no qemu-aarch64-static or qemu-aarch64 on PATH (Debian: apt-get install qemu-user-static)")
}

// Deterministic training on arm64 (under qemu) ends with the weights of
// the same training on this amd64 machine.
func TestArm64WeightsAreAmd64Weights(t *testing.T) {
	if os.Getenv(workerEnv) != "" {
		t.Skip("worker")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("compares an amd64 run with an arm64 one; this is " + runtime.GOARCH)
	}
	if testing.Short() {
		t.Skip("cross-compiles and runs training under qemu (~1 min)")
	}
	qemuPath, err := qemu()
	if err != nil {
		t.Skip(err)
	}
	bin := filepath.Join(t.TempDir(), "crossarch.arm64.test")
	build := exec.Command("go", "test", "-c", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("GOARCH=arm64 go test -c: %v\n%s", err, out)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.slow && os.Getenv("PPNODE_CROSSARCH_RESNET") == "" {
				t.Skip("takes 7-8 minutes under qemu; set PPNODE_CROSSARCH_RESNET=1")
			}
			dir := t.TempDir()
			want, err := weightsSHA(c, 2, dir)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			cmd := exec.Command(qemuPath, bin, "-test.run=^TestWorker$", "-test.count=1")
			cmd.Env = append(os.Environ(), workerEnv+"="+c.name, dataEnv+"="+dir)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("arm64 under qemu: %v\n%s%s", err, out, stderr.Bytes())
			}
			got := ""
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "weights_sha256" && f[1] == "arm64" {
					got = f[2]
				}
			}
			if got == "" {
				t.Fatalf("arm64 under qemu printed no fingerprint:\n%s", out)
			}
			t.Logf("%s (%s): amd64 %s, arm64 %s (%.0f s under qemu)", c.name, c.flags, want[:16], got[:16], time.Since(start).Seconds())
			if got != want {
				t.Errorf("arm64 trained other weights: %s, amd64 %s", got, want)
			}
		})
	}
}
