package integration

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/data"
)

const torchPython = "/usr/bin/python3"

// torchMissing says once why PyTorch cannot run (importing it takes seconds).
var torchMissing = sync.OnceValue(func() error {
	return exec.Command(torchPython, "-c", "import torch, numpy").Run()
})

func needTorch(t *testing.T) {
	t.Helper()
	if err := torchMissing(); err != nil {
		t.Skipf("no PyTorch for %s (Debian's python3-torch): %v", torchPython, err)
	}
}

// Models exported from PyTorch to ONNX train on three nodes with the
// automatic plan, and in deterministic mode give --local's weights.
func TestONNXModel(t *testing.T) {
	t.Parallel()
	needTorch(t)
	for _, c := range []struct{ model, shape string }{
		{"towers", "24"}, // slices, towers, a concatenation: the graph planner's
		{"resnet", "3, 8, 8"},
	} {
		t.Run(c.model, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if out, err := exec.Command(torchPython, "../onnx/testdata/torch_onnx.py", c.model, dir).CombinedOutput(); err != nil {
				t.Fatalf("torch_onnx.py: %v\n%s", err, out)
			}
			script := `import sys, numpy as np
rng = np.random.default_rng(2)
x = rng.normal(size=(480, ` + c.shape + `)).astype(np.float32)
y = (x.reshape(len(x), -1)[:, :8].sum(1) > 0).astype(np.int64) + 2 * (x.reshape(len(x), -1)[:, -8:].sum(1) > 0)
np.savez(sys.argv[1], x=x, y=y)`
			data := filepath.Join(dir, "data.npz")
			if out, err := exec.Command(torchPython, "-c", script, data).CombinedOutput(); err != nil {
				t.Fatalf("numpy: %v\n%s", err, out)
			}
			args := []string{"--deterministic", "--model", filepath.Join(dir, "model.onnx"), "--data", data,
				"--batch", "32", "--micro-batches", "4", "--steps", "12", "--optimizer", "sgd", "--threads", "1"}
			local, err := Train(t, time.Minute, append([]string{"--local"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			cl := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
			waitMembers(t, cl.Node("a"), 3)
			via, err := Train(t, 2*time.Minute, append([]string{"--via", cl.Node("a").HTTP}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if via.WeightsSHA256 != local.WeightsSHA256 {
				t.Errorf("three nodes: weights %s, --local %s", via.WeightsSHA256, local.WeightsSHA256)
			}
			if via.TestAccuracy != local.TestAccuracy || via.TestLoss != local.TestLoss || via.EvaluatedOn != "stages" {
				t.Errorf("three nodes: test accuracy %v, loss %v, evaluated on the %s; --local %v, %v", via.TestAccuracy, via.TestLoss, via.EvaluatedOn, local.TestAccuracy, local.TestLoss)
			}
			t.Logf("%s: plan %s; weights %.16s on one process and on %d nodes", c.model, via.Plan, via.WeightsSHA256, len(via.Nodes))
		})
	}
}

// The model families of python/ppnode_models.py (transformers, one with a
// padding mask, GPT with its head tied to the embedding (its weights load
// into PyTorch), ALBERT's one block applied three times, an encoder-decoder
// transformer, a classifier pooling each sequence's last token, a LLaMA, DLRM, a
// two-tower model, LSTM, a stacked bidirectional LSTM, ViT, an
// autoencoder, GroupNorm and its kin, odds and ends) and torchvision's MobileNetV2 and V3 train on three nodes with the
// automatic plan and give --local's weights in deterministic mode. (The
// untied GPT, the GRU, the text CNN, Swin and the siamese pair, which
// onnx's tests compare with PyTorch, add no path of their own here.)
func TestONNXFamilies(t *testing.T) {
	t.Parallel()
	needTorch(t)
	cl := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, cl.Node("a"), 3)
	models := []string{"tiedgpt", "albert", "seq2seq", "lasttoken", "llama", "dlrm", "twotower", "transformer", "padmask", "vit", "lstm", "bilstm", "mobilenetv3", "autoencoder", "normact", "misc", "mobilenet", "denoise", "ctr", "segment", "padlm"}
	root := t.TempDir()
	export := append([]string{"../onnx/testdata/torch_onnx.py", "--each", root, "240"}, models...)
	if out, err := exec.Command(torchPython, export...).CombinedOutput(); err != nil {
		t.Fatalf("torch_onnx.py: %v\n%s", err, out)
	}
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(root, model)
			args := []string{"--deterministic", "--model", filepath.Join(dir, "model.onnx"), "--data", filepath.Join(dir, "data.npz"),
				"--batch", "24", "--micro-batches", "3", "--steps", "6", "--optimizer", "adam", "--threads", "1"}
			switch model {
			case "ctr": // a click a sample: one logit against y of [N], the clicks weighted (the automatic plan keeps it on one node)
				args = append(args, "--loss", "bce", "--pos-weight", "3")
			case "denoise": // (its float images take mse unasked); the automatic plan keeps it on one node
				args = append(args, "--partition", "uniform")
			case "segment": // a class a pixel, the classes weighted; the automatic plan keeps it on one node
				args = append(args, "--partition", "uniform", "--class-weights", "0.5,1,2,1,0.25")
			case "tiedgpt": // gradients clipped by their norm over the stages (the tied tensor once); AdamW, biases and norms not decayed
				args = append(args, "--clip-grad-norm", "0.05", "--optimizer", "adamw", "--weight-decay", "0.1", "--no-decay-1d")
			case "mobilenet": // fine-tuning: the first blocks frozen, the stage that holds them trains nothing
				args = append(args, "--freeze", "features.0.,features.1.,features.2.,features.3.,features.4.")
			case "transformer": // Hugging Face's linear decay, to a floor
				args = append(args, "--lr-schedule", "linear", "--min-lr", "1e-4")
			case "padlm": // ignored labels, token 0's embedding row not trained, and label smoothing on the loss stage
				args = append(args, "--partition", "uniform", "--padding-idx", "tok.weight=0", "--label-smoothing", "0.1")
			}
			local, err := Train(t, time.Minute, append([]string{"--local"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			via := []string{"--via", cl.Node("a").HTTP}
			if model == "tiedgpt" { // (a node keeps the weights of its 8 newest jobs only)
				via = append(via, "--out", filepath.Join(dir, "out.safetensors"))
			}
			res, err := Train(t, 2*time.Minute, append(via, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if res.WeightsSHA256 != local.WeightsSHA256 {
				t.Errorf("three nodes: weights %s, --local %s", res.WeightsSHA256, local.WeightsSHA256)
			}
			if want := map[string]string{"denoise": "mse", "ctr": "bce"}[model]; res.Loss != want && want != "" || math.Abs(res.TestLoss-local.TestLoss) > 1e-6*math.Abs(local.TestLoss) {
				t.Errorf("three nodes: loss %q, test loss %v; --local %q, %v", res.Loss, res.TestLoss, local.Loss, local.TestLoss)
			}
			if model == "tiedgpt" {
				loadTied(t, filepath.Join(dir, "out.safetensors"))
			}
			if model == "padlm" { // the smoothing took part
				plain, err := Train(t, time.Minute, append([]string{"--local"}, args[:len(args)-2]...)...)
				if err != nil || plain.WeightsSHA256 == res.WeightsSHA256 {
					t.Errorf("without label smoothing: weights %.16s, %v", plain.WeightsSHA256, err)
				}
			}
			t.Logf("%s: plan %s; weights %.16s on one process and on %d nodes", model, res.Plan, res.WeightsSHA256, len(res.Nodes))
		})
	}
}

// loadTied loads the weights of torch_onnx.py's tied GPT into its PyTorch
// module with strict=True: the file holds the tied tensor under both the
// embedding's and the head's names, and they stay one tensor.
func loadTied(t *testing.T, path string) {
	t.Helper()
	script := `import sys, torch
sys.path.insert(0, "../python")
import ppnode_models as pm
m = pm.GPT(vocab=5, ctx=8, d=16, heads=2, blocks=2, tie=True)
sd = pm.read_safetensors(sys.argv[1])[0]
m.load_state_dict(sd, strict=True)
assert m.head.weight is m.tok.weight and torch.equal(m.tok.weight, sd["head.weight"])
print("ok")`
	if out, err := exec.Command(torchPython, "-c", script, path).CombinedOutput(); err != nil {
		t.Fatalf("loading the tied GPT's weights into PyTorch: %v\n%s", err, out)
	}
}

// Weights out of a distributed run (train --via --out) load into the
// reference PyTorch module (python/ppnode_models.py) with
// load_state_dict(strict=True) and give ppnode's test accuracy on MNIST.
// resnet50 (a minute, most of it evaluating) runs with PPNODE_RESNET=1.
func TestWeightsIntoPyTorch(t *testing.T) {
	t.Parallel()
	needTorch(t)
	cl := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, cl.Node("a"), 2)
	type run struct {
		model string
		args  []string
	}
	runs := []run{{"mlp32", []string{"--width", "64", "--steps", "60", "--lr", "0.002"}}}
	if os.Getenv("PPNODE_RESNET") == "1" {
		runs = append(runs, run{"resnet50", []string{"--width", "0.0625", "--steps", "20", "--batch", "32", "--optimizer", "sgd", "--lr", "0.05"}})
	}
	for _, c := range runs {
		out := filepath.Join(t.TempDir(), c.model+".safetensors")
		args := append([]string{"--via", cl.Node("a").HTTP, "--model", c.model, "--out", out, "--threads", "1"}, c.args...)
		res, err := Train(t, 3*time.Minute, args...)
		if err != nil {
			t.Fatal(err)
		}
		b, err := exec.Command(torchPython, "../bench/torch_weights.py", out, mnistDir(t)).CombinedOutput()
		if err != nil {
			t.Fatalf("torch_weights.py: %v\n%s", err, b)
		}
		var got struct {
			TestAccuracy  float64 `json:"test_accuracy"`
			WeightsSHA256 string  `json:"weights_sha256"`
		}
		if err := json.Unmarshal(lastLine(b), &got); err != nil {
			t.Fatalf("torch_weights.py: %v\n%s", err, b)
		}
		if math.Abs(got.TestAccuracy-res.TestAccuracy) > 0.001 || got.WeightsSHA256 != res.WeightsSHA256 {
			t.Errorf("%s: PyTorch's test accuracy %.4f (weights %.16s), ppnode's %.4f (%.16s)", c.model, got.TestAccuracy, got.WeightsSHA256, res.TestAccuracy, res.WeightsSHA256)
		}
		t.Logf("%s: test accuracy %.4f in ppnode, %.4f in PyTorch", c.model, res.TestAccuracy, got.TestAccuracy)
	}
}

func mnistDir(t *testing.T) string {
	t.Helper()
	dir, err := data.MNISTDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// lastLine is the last non-empty line of b.
func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}
