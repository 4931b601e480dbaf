package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// trainFlags are the training options shared by local and cluster runs.
type trainFlags struct {
	local         bool
	model, data   string
	init          string
	width         float64
	batch         int
	micro         microBatches
	epochs, steps int
	lr            float64
	momentum, wd  float64
	noDecay1D     bool
	minLR         float64
	optimizer     string
	loss          string
	smoothing     float64
	posWeight     floatList
	classWeights  floatList
	freeze        string
	padding       paddingRows
	evalEvery     int
	evalEpoch     bool
	clip          float64
	schedule      string
	warmup        int
	seed          uint64
	deterministic bool
	backend       string
	threads       int
	out           string
	json          bool
	trainSamples  int
	standardize   bool
}

func (f *trainFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.local, "local", false, "train in this process")
	fs.StringVar(&f.model, "model", "mlp32", "model: "+strings.Join(zoo.Names(), ", ")+", or an ONNX file exported from PyTorch (model.onnx)")
	fs.StringVar(&f.data, "data", "mnist", "data set: mnist, fashion-mnist, synthetic[:HxWxC[:classes]], or a .npz or .safetensors file\n"+
		"holding x (samples) and y (labels), optionally x_test and y_test (with --via: a path on the node's machine)")
	fs.StringVar(&f.init, "init", "", "start from the weights in this safetensors file (names and shapes of the model's PyTorch state_dict, as --out writes them)")
	fs.Float64Var(&f.width, "width", 0, "mlp32: hidden units (default 512); other models: width factor (default 1)")
	fs.IntVar(&f.batch, "batch", 128, "mini-batch size")
	f.micro = 4
	fs.Var(&f.micro, "micro-batches", "micro-batches per mini-batch, or auto: the number the coordinator's plan\n"+
		"simulates fastest on the nodes (not with --local or --deterministic)")
	fs.IntVar(&f.epochs, "epochs", 3, "epochs; with --steps and without --epochs, as many as the steps need\n"+
		"(with both, the smaller wins)")
	fs.IntVar(&f.steps, "steps", 0, "train this many steps (0: all epochs)")
	fs.Float64Var(&f.lr, "lr", 0, "peak learning rate (default: 3e-4 for adam, 0.005 for sgd)")
	fs.Float64Var(&f.momentum, "momentum", 0.9, "SGD momentum")
	fs.Float64Var(&f.wd, "weight-decay", 0, "weight decay")
	fs.BoolVar(&f.noDecay1D, "no-decay-1d", false, "leave one-dimensional tensors (biases, normalisation scales) out of the weight decay,\n"+
		"as nanoGPT and Hugging Face's Trainer do (PyTorch parameter groups split by p.dim() >= 2)")
	fs.StringVar(&f.optimizer, "optimizer", "adam", "adam, adamw (decoupled weight decay: give --weight-decay, PyTorch's AdamW default is 0.01) or sgd")
	fs.StringVar(&f.loss, "loss", "", "what training minimises: ce (softmax cross-entropy against class labels), mse, l1 or huber\n"+
		"(squared, absolute or Huber error against float targets of the output's shape) or bce (binary cross-entropy\n"+
		"of logits against targets in [0, 1]) (default: ce for integer labels, mse for float targets)")
	fs.StringVar(&f.freeze, "freeze", "", "train only part of the model: comma-separated prefixes of state_dict names (\"encoder.,embed.\")\n"+
		"whose parameters stay as --init or the model file gives them (PyTorch's requires_grad=False)")
	fs.Var(&f.padding, "padding-idx", "embedding rows that take no gradient, as nn.Embedding's padding_idx (not in an ONNX file):\n"+
		"TABLE=ROW, comma-separated, tables by state_dict name (\"tok.weight=0\")")
	fs.IntVar(&f.evalEvery, "eval-every", 0, "also evaluate the test split after every N steps, not only at the end (nanoGPT's eval_interval)")
	fs.BoolVar(&f.evalEpoch, "eval-each-epoch", false, "also evaluate the test split at every epoch's end")
	fs.Float64Var(&f.clip, "clip-grad-norm", 0, "scale each step's gradients so that their norm over the model is at most this (PyTorch's clip_grad_norm_; 0: none)")
	fs.Var(&f.posWeight, "pos-weight", "with the bce loss, weigh each positive target's term (PyTorch's pos_weight): one number for every output,\n"+
		"or one a value of the output's last axis, comma-separated (negatives/positives balances an imbalanced set)")
	fs.Var(&f.classWeights, "class-weights", "with the ce loss, weigh each label's loss by its class's weight: one number a class,\n"+
		"comma-separated (PyTorch's CrossEntropyLoss weight=; the mean divides by the labels' weights)")
	fs.Float64Var(&f.smoothing, "label-smoothing", 0, "with the ce loss, take each label as 1-ε on it and ε spread over the classes (PyTorch's label_smoothing)")
	fs.StringVar(&f.schedule, "lr-schedule", "cosine", "learning-rate schedule after the warm-up: cosine (half a cosine down to --min-lr at the last step,\n"+
		"as nanoGPT's), linear (a straight line down to --min-lr, Hugging Face's default) or constant")
	fs.Float64Var(&f.minLR, "min-lr", 0, "the rate cosine and linear decay to (nanoGPT sets a tenth of --lr)")
	fs.IntVar(&f.warmup, "warmup-steps", -1, "steps of linear learning-rate warm-up (default: min(150, steps/5))")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of initialisation, data order and dropout")
	fs.BoolVar(&f.deterministic, "deterministic", false, "same bits on every run and machine (pure-Go GEMM)")
	fs.StringVar(&f.backend, "backend", "", "GEMM backend: ppnode, ppnode-det (deterministic; formerly gonum) or openblas (default: the fastest compiled in; with --deterministic, ppnode-det)")
	fs.IntVar(&f.threads, "threads", 0, "threads (default: all CPUs)")
	fs.StringVar(&f.out, "out", "", "write the trained weights to this safetensors file")
	fs.BoolVar(&f.json, "json", false, "print one JSON object as the last line")
	fs.IntVar(&f.trainSamples, "synthetic-samples", 0, "synthetic data: training samples (default 4096)")
	fs.BoolVar(&f.standardize, "standardize", true, "scale each input channel to zero mean and unit variance (training-set statistics)")
}

// spec turns the flags into a job spec. File paths are made absolute: the
// nodes that run the job read them where they are. set holds the flags
// given on the command line: --steps without --epochs runs as many epochs
// as the steps need.
func (f *trainFlags) spec(set map[string]bool) job.Spec {
	epochs := f.epochs
	if set["steps"] && !set["epochs"] {
		epochs = 0
	}
	abs := func(path string, isFile bool) string {
		if p, err := filepath.Abs(path); isFile && err == nil {
			return p
		}
		return path
	}
	var freeze []string
	if f.freeze != "" {
		freeze = strings.Split(f.freeze, ",")
	}
	return job.Spec{
		Model: abs(f.model, job.IsModelFile(f.model)), Data: abs(f.data, data.IsFile(f.data)),
		Init: abs(f.init, f.init != ""), Width: f.width, Batch: f.batch, MicroBatches: int(f.micro),
		Epochs: epochs, Steps: f.steps, Optimizer: f.optimizer, Loss: f.loss, LabelSmoothing: f.smoothing, PosWeight: f.posWeight, ClassWeights: f.classWeights, Freeze: freeze, PaddingIdx: f.padding, ClipGradNorm: f.clip, LR: f.lr, Momentum: f.momentum,
		WeightDecay: f.wd, NoDecay1D: f.noDecay1D, LRSchedule: f.schedule, MinLR: f.minLR, Warmup: f.warmup, Seed: f.seed,
		Deterministic: f.deterministic, Backend: f.backend, Threads: f.threads,
		SyntheticSamples: f.trainSamples, Standardize: f.standardize, EvalEvery: f.evalEvery, EvalEachEpoch: f.evalEpoch,
	}
}

// evaluation describes an evaluation during training.
func evaluation(scores bool, e job.EvalResult) string {
	s := fmt.Sprintf("test after step %d: loss %.4f", e.Step, e.TestLoss)
	if e.Perplexity > 0 {
		s += fmt.Sprintf(" (perplexity %.2f)", e.Perplexity)
	}
	if scores {
		s += fmt.Sprintf(", accuracy %.4f", e.Accuracy)
	}
	if e.AUC > 0 {
		s += fmt.Sprintf(", AUC %.4f", e.AUC)
	}
	return s
}

// frozenCount is the number of frozen scalars of g (a tied tensor's once).
func frozenCount(g *nn.Graph) int {
	n := 0
	for _, p := range nn.Unique(g.Params()) {
		if p.Frozen {
			n += nn.Size(p.Value.Shape())
		}
	}
	return n
}

// floatList is a comma-separated list of numbers.
type floatList []float64

func (l *floatList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

func (l *floatList) Set(v string) error {
	*l = nil
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", f)
		}
		*l = append(*l, x)
	}
	return nil
}

// paddingRows is --padding-idx: TABLE=ROW, comma-separated.
type paddingRows map[string]int

func (p *paddingRows) String() string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(*p)) {
		s = append(s, fmt.Sprintf("%s=%d", k, (*p)[k]))
	}
	return strings.Join(s, ",")
}

func (p *paddingRows) Set(v string) error {
	*p = paddingRows{}
	for _, kv := range strings.Split(v, ",") {
		k, row, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(row)
		if !ok || k == "" || err != nil {
			return fmt.Errorf("%q: want TABLE=ROW (tok.weight=0)", kv)
		}
		(*p)[k] = n
	}
	return nil
}

// microBatches is a number of micro-batches, or auto (0).
type microBatches int

func (m *microBatches) String() string {
	if *m == 0 {
		return "auto"
	}
	return strconv.Itoa(int(*m))
}

func (m *microBatches) Set(s string) error {
	if s == "auto" {
		*m = 0
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want auto or a positive number, got %q", s)
	}
	*m = microBatches(n)
	return nil
}

func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("train", "--local | --via host:port [--model M] [--data D] [--epochs N | --steps N] [flags]")
	var f trainFlags
	f.register(fs)
	var c clusterFlags
	c.register(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	spec := f.spec(setFlags(fs))
	if !f.local {
		// The node checks the spec: a bad one is its 400, which names
		// what is wrong.
		return trainVia(spec, &f, &c, stdout, stderr)
	}
	cs, err := job.Check(spec)
	if err != nil {
		return usageError{err}
	}
	threads := f.threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	runtime.GOMAXPROCS(threads)
	jb, err := cs.Prepare()
	if err != nil {
		if errors.Is(err, job.ErrSpec) {
			return usageError{err}
		}
		return err
	}
	params := fmt.Sprintf("%d parameters", jb.Graph.ParamCount())
	if n := frozenCount(jb.Graph); n > 0 {
		params = fmt.Sprintf("%d trainable parameters, %d frozen", jb.Graph.ParamCount(), n)
	}
	fmt.Fprintf(stderr, "training %s (%s) on %s: %d steps of %d samples in %d micro-batches, %d threads\n",
		f.model, params, f.data, jb.Total, f.batch, f.micro, threads)
	if note := stepsNote(spec, jb.Total); note != "" {
		fmt.Fprintln(stderr, note)
	}
	bar := newProgress(stderr, jb.Total, f.batch, f.json, time.Now())
	res, err := jb.TrainLocal(threads, job.LocalHooks{
		Step:       func(step int, loss, rate float64) { bar.update(time.Now(), step, loss, rate) },
		Evaluating: func(step, done, samples int) { bar.evaluating(time.Now(), step, done, samples) },
		Evaluated:  func(e job.EvalResult) { bar.note(evaluation(jb.ScoresAccuracy(), e)) },
	})
	bar.done()
	if err != nil {
		return err
	}
	if f.out != "" {
		if err := saveWeights(f.out, jb, *res); err != nil {
			return err
		}
	}
	return printResult(res, f.json, stdout, stderr)
}

// printResult prints a job's result: a summary, and with asJSON one JSON
// object as the last line of stdout.
func printResult(res *job.Result, asJSON bool, stdout, stderr io.Writer) error {
	fmt.Fprintf(stderr, "done: %d steps in %.1f s, %.0f samples/s, last loss %.4f, %stest loss %.4f%s%s\n",
		res.Steps, res.Seconds, res.SamplesPerSec, res.TrainLoss, accuracy(res, ", "), res.TestLoss, testNotes(res, ", "), evaluated(res))
	if asJSON {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	fmt.Fprintf(stdout, "model %s  steps %d  samples/s %.0f  train loss %.4f  %stest loss %.4f%s  weights %s\n",
		res.Model, res.Steps, res.SamplesPerSec, res.TrainLoss, accuracy(res, "  "), res.TestLoss, testNotes(res, "  "), res.WeightsSHA256[:16])
	return nil
}

// evaluated shows how long the final evaluation took, and where.
func evaluated(res *job.Result) string {
	if res.EvaluatedOn == "" {
		return fmt.Sprintf(", evaluated in %.1f s", res.EvalSeconds)
	}
	return fmt.Sprintf(", evaluated on the %s in %.1f s", res.EvaluatedOn, res.EvalSeconds)
}

// accuracy shows the test accuracy followed by sep, unless the loss has
// none (a regression's error): then the loss's name.
func accuracy(res *job.Result, sep string) string {
	if res.Loss != "" && !nn.LossScores(res.Loss) {
		return "loss " + res.Loss + sep
	}
	return fmt.Sprintf("test accuracy %.4f%s", res.TestAccuracy, sep)
}

// testNotes shows a language model's test perplexity, a binary
// cross-entropy's AUC after sep.
func testNotes(res *job.Result, sep string) string {
	s := ""
	if res.Perplexity > 0 {
		s += fmt.Sprintf(" (perplexity %.2f)", res.Perplexity)
	}
	if res.TestAUC > 0 {
		s += fmt.Sprintf("%sAUC %.4f", sep, res.TestAUC)
	}
	return s
}

// stepsNote says which of a spec's bounds, epochs or steps, ends a job of
// total steps when it has both ("" when it has one).
func stepsNote(spec job.Spec, total int) string {
	if spec.Epochs == 0 || spec.Steps == 0 {
		return ""
	}
	if total < spec.Steps {
		return fmt.Sprintf("--epochs %d ends the job after %d steps, before --steps %d: the smaller wins", spec.Epochs, total, spec.Steps)
	}
	return fmt.Sprintf("--steps %d ends the job before --epochs %d: the smaller wins", spec.Steps, spec.Epochs)
}
