package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// trainFlags are the training options shared by local and cluster runs.
type trainFlags struct {
	local         bool
	model, data   string
	width         float64
	batch, micro  int
	epochs, steps int
	lr            float64
	momentum, wd  float64
	optimizer     string
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
	fs.StringVar(&f.model, "model", "mlp32", "model: "+fmt.Sprint(zoo.Names()))
	fs.StringVar(&f.data, "data", "mnist", "data set: mnist, fashion-mnist, synthetic[:HxWxC[:classes]]")
	fs.Float64Var(&f.width, "width", 0, "mlp32: hidden units (default 512); other models: width factor (default 1)")
	fs.IntVar(&f.batch, "batch", 128, "mini-batch size")
	fs.IntVar(&f.micro, "micro-batches", 4, "micro-batches per mini-batch")
	fs.IntVar(&f.epochs, "epochs", 3, "epochs")
	fs.IntVar(&f.steps, "steps", 0, "stop after this many steps (0: all epochs)")
	fs.Float64Var(&f.lr, "lr", 0, "peak learning rate (default: 3e-4 for adam, 0.005 for sgd)")
	fs.Float64Var(&f.momentum, "momentum", 0.9, "SGD momentum")
	fs.Float64Var(&f.wd, "weight-decay", 0, "weight decay")
	fs.StringVar(&f.optimizer, "optimizer", "adam", "adam or sgd")
	fs.StringVar(&f.schedule, "lr-schedule", "cosine", "learning-rate schedule: cosine (decays to 0 at the last step) or constant")
	fs.IntVar(&f.warmup, "warmup-steps", -1, "steps of linear learning-rate warm-up (default: min(150, steps/5))")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of initialisation, data order and dropout")
	fs.BoolVar(&f.deterministic, "deterministic", false, "same bits on every run and machine (pure-Go GEMM)")
	fs.StringVar(&f.backend, "backend", "", "GEMM backend (default: the fastest compiled in)")
	fs.IntVar(&f.threads, "threads", 0, "threads (default: all CPUs)")
	fs.StringVar(&f.out, "out", "", "write the trained weights to this safetensors file")
	fs.BoolVar(&f.json, "json", false, "print one JSON object as the last line")
	fs.IntVar(&f.trainSamples, "synthetic-samples", 0, "synthetic data: training samples (default 4096)")
	fs.BoolVar(&f.standardize, "standardize", true, "scale each input channel to zero mean and unit variance (training-set statistics)")
}

// trainResult is the final JSON line of ppnode train.
type trainResult struct {
	Model         string  `json:"model"`
	Data          string  `json:"data"`
	Params        int     `json:"params"`
	Steps         int     `json:"steps"`
	Epochs        float64 `json:"epochs"`
	Batch         int     `json:"batch"`
	MicroBatches  int     `json:"micro_batches"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	TrainLoss     float64 `json:"train_loss"`
	TrainAccuracy float64 `json:"train_accuracy"`
	TestAccuracy  float64 `json:"test_accuracy"`
	Backend       string  `json:"backend"`
	Threads       int     `json:"threads"`
	Deterministic bool    `json:"deterministic"`
	Seconds       float64 `json:"seconds"`
	WeightsSHA256 string  `json:"weights_sha256"`
}

func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f trainFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if !f.local {
		return usagef("only --local training is available in this build")
	}
	if f.batch < 1 || f.micro < 1 || f.micro > f.batch {
		return usagef("need 1 <= --micro-batches (%d) <= --batch (%d)", f.micro, f.batch)
	}
	if f.epochs < 1 || f.steps < 0 {
		return usagef("need --epochs >= 1 and --steps >= 0")
	}
	if !slices.Contains(zoo.Names(), f.model) {
		return usagef("unknown model %q (have %v)", f.model, zoo.Names())
	}
	threads := f.threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	runtime.GOMAXPROCS(threads)
	be, err := nn.NewBackend(f.backend, threads, f.deterministic)
	if err != nil {
		return err
	}
	set, err := data.Load(f.data, data.Options{Seed: f.seed, Train: f.trainSamples})
	if err != nil {
		return err
	}
	if f.standardize {
		set.Standardize()
	}
	g, err := zoo.Build(f.model, zoo.Options{Width: f.width, Input: set.Train.Shape, Classes: set.Classes})
	if err != nil {
		return err
	}
	g.Init(f.seed)
	if f.lr == 0 {
		f.lr = 0.005
		if f.optimizer == "adam" {
			f.lr = 3e-4
		}
	}
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Name: f.optimizer, LR: f.lr, Momentum: f.momentum, WeightDecay: f.wd, Threads: threads})
	if err != nil {
		return err
	}
	loader, err := data.NewLoader(set.Train, f.seed, f.batch, f.micro)
	if err != nil {
		return err
	}
	tr := nn.NewTrainer(g, opt, be, f.seed)
	spe := loader.StepsPerEpoch()
	if spe == 0 {
		return usagef("--batch %d is larger than the %d training samples", f.batch, set.Train.N)
	}
	total := f.epochs * spe
	if f.steps > 0 {
		total = min(total, f.steps)
	}
	if f.warmup < 0 {
		f.warmup = min(150, total/5)
	}
	sched, err := nn.NewSchedule(f.schedule, f.lr, f.warmup, total)
	if err != nil {
		return usageError{err}
	}
	progress := newProgress(stderr, total, f.json)
	fmt.Fprintf(stderr, "training %s (%d parameters) on %s: %d steps of %d samples in %d micro-batches, backend %s, %d threads\n",
		f.model, g.ParamCount(), f.data, total, f.batch, f.micro, be.Name(), threads)
	start := time.Now()
	var last nn.StepResult
	var lossSum float64
	var lossN, correct, seen int
	for s := 0; s < total; s++ {
		epoch, step := s/spe, s%spe
		opt.SetLR(sched.At(s))
		last = tr.Step(loader, epoch, step, s)
		lossSum += last.Loss
		lossN++
		correct += last.Correct
		seen += last.Samples
		progress.update(s+1, last.Loss, float64((s+1)*f.batch)/time.Since(start).Seconds())
	}
	elapsed := time.Since(start).Seconds()
	progress.done()
	test := set.Test
	chunk, i := 256, 0
	acc := tr.Evaluate(func(x *nn.Tensor, y []int32) (*nn.Tensor, []int32) {
		if i >= test.EvalChunks(chunk) {
			return nil, nil
		}
		i++
		return test.EvalChunk(i-1, chunk, x, y)
	})
	params := g.Params()
	res := trainResult{
		Model: f.model, Data: f.data, Params: g.ParamCount(), Steps: total, Epochs: float64(total) / float64(spe),
		Batch: f.batch, MicroBatches: f.micro, SamplesPerSec: float64(total*f.batch) / elapsed,
		TrainLoss: last.Loss, TrainAccuracy: float64(correct) / float64(max(seen, 1)), TestAccuracy: acc,
		Backend: be.Name(), Threads: threads, Deterministic: f.deterministic, Seconds: elapsed,
		WeightsSHA256: nn.WeightsSHA256(params),
	}
	if f.out != "" {
		if err := saveWeights(f.out, params, res); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "done: %d steps in %.1f s, %.0f samples/s, last loss %.4f, test accuracy %.4f\n",
		total, elapsed, res.SamplesPerSec, res.TrainLoss, acc)
	if f.json {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "model %s  steps %d  samples/s %.0f  train loss %.4f  test accuracy %.4f  weights %s\n",
			res.Model, res.Steps, res.SamplesPerSec, res.TrainLoss, res.TestAccuracy, res.WeightsSHA256[:16])
	}
	return nil
}

// progress draws a one-line progress bar on a terminal and stays silent
// otherwise (or with --json, whose output is for programs).
type progress struct {
	w     io.Writer
	total int
	on    bool
	last  time.Time
}

func newProgress(w io.Writer, total int, quiet bool) *progress {
	on := false
	if f, ok := w.(*os.File); ok && !quiet {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			on = true
		}
	}
	return &progress{w: w, total: total, on: on}
}

func (p *progress) update(step int, loss, rate float64) {
	if !p.on || (step < p.total && time.Since(p.last) < 200*time.Millisecond) {
		return
	}
	p.last = time.Now()
	const width = 30
	done := width * step / p.total
	bar := make([]byte, width)
	for i := range bar {
		switch {
		case i < done:
			bar[i] = '='
		case i == done:
			bar[i] = '>'
		default:
			bar[i] = ' '
		}
	}
	fmt.Fprintf(p.w, "\r[%s] %d/%d  loss %.4f  %.0f samples/s ", bar, step, p.total, loss, rate)
}

func (p *progress) done() {
	if p.on {
		fmt.Fprintln(p.w)
	}
}
