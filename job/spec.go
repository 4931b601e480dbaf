package job

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
	"github.com/ppnode/ppnode/onnx"
	"github.com/ppnode/ppnode/onnx/onnxpb"
	"github.com/ppnode/ppnode/tensorio"
)

// Spec is what a user asks for: a model, a data set and the training
// recipe, and for a pipelined job how to plan it. It is JSON, the body of
// a job submission. `ppnode train --local` and a pipelined job read the
// same spec through [Check] and [Checked.Prepare], so that with the same
// seed, batch and micro-batches both compute the same thing.
type Spec struct {
	ID string `json:"id,omitempty"`
	// Model is a model of the zoo or the path of an ONNX file (on every
	// node that runs a stage, as the data file's).
	Model string  `json:"model"`
	Data  string  `json:"data"`
	Width float64 `json:"width,omitempty"`
	// Init is the path of a safetensors file of initial weights (PyTorch
	// names and layouts, as `--out` writes them); empty: the seed's or the
	// ONNX file's.
	Init string `json:"init,omitempty"`
	// Files holds the SHA-256 of the files the spec names, by path, as the
	// submitting client read them: a node whose file differs refuses the job
	// rather than train another model (see HashFiles).
	Files map[string]string `json:"files,omitempty"`
	// files, if set, opens the files the spec names (ReadingFrom);
	// otherwise they are opened by path.
	files *Files

	Batch int `json:"batch"`
	// MicroBatches is M, the micro-batches a step's batch is cut into; 0
	// (auto) lets the coordinator choose the M its plan simulates fastest
	// on the nodes at hand (see [Checked.WithMicroBatches]). A
	// deterministic job names its M: the sums it fixes decide the weights.
	MicroBatches int `json:"micro_batches"`
	// Epochs and Steps bound the job's length: it runs Epochs passes over
	// the training set, or Steps steps, whichever ends first. Epochs 0
	// means as many as Steps needs (the job runs exactly Steps steps);
	// Steps 0 means all of Epochs. One of them is not 0 (see [Job.Total]).
	Epochs int `json:"epochs"`
	Steps  int `json:"steps,omitempty"`

	Optimizer   string  `json:"optimizer"`
	LR          float64 `json:"lr,omitempty"` // 0: 3e-4 for adam, 0.005 for sgd
	Momentum    float64 `json:"momentum"`
	WeightDecay float64 `json:"weight_decay,omitempty"`
	// NoDecay1D leaves biases and normalisation scales (the tensors of
	// one axis) out of the weight decay (nn.OptimizerConfig).
	NoDecay1D  bool   `json:"no_decay_1d,omitempty"`
	LRSchedule string `json:"lr_schedule"`
	// MinLR is the rate the cosine and linear schedules decay to (0: to 0).
	MinLR float64 `json:"min_lr,omitempty"`
	// Warmup is the linear warm-up in steps; -1 means min(150, steps/5).
	Warmup int `json:"warmup"`

	Seed          uint64 `json:"seed"`
	Deterministic bool   `json:"deterministic,omitempty"`
	// Backend and Threads apply on every node; Threads 0 means the
	// node's own thread count.
	Backend string `json:"backend,omitempty"`
	Threads int    `json:"threads,omitempty"`

	SyntheticSamples int  `json:"synthetic_samples,omitempty"`
	Standardize      bool `json:"standardize"`

	// Partition is "auto" (the balancer: balanced, or graph for models
	// with parallel branches), "uniform", "params", "balanced", "graph",
	// or a partition description such as "fc1-fc16@a; fc17-fc32@b".
	Partition string `json:"partition,omitempty"`
	// Schedule is "auto", "gpipe", "1f1b", "graph", "zb" or "interleaved".
	Schedule string `json:"schedule,omitempty"`
	// Chunks is, under the interleaved schedule, the stages (chunks) each
	// node holds, 2 or more; 0 lets the planner choose 2, 3 or 4 by
	// simulation. Other schedules take none.
	Chunks int `json:"chunks,omitempty"`
	// Recompute is "none" (empty), "auto" (stages recompute their
	// activations at the backward pass where their node's memory requires
	// it) or "all" (balance.Options.Recompute).
	Recompute string `json:"recompute,omitempty"`
	// MaxNodes bounds the nodes the job may use (0: all).
	MaxNodes int `json:"max_nodes,omitempty"`
	// NoRebalance keeps the first plan (an automatic plan otherwise
	// follows the measured node speeds and the nodes that join and leave).
	NoRebalance bool `json:"no_rebalance,omitempty"`
	// CheckpointEvery is the interval of consistent cuts in steps (0:
	// chosen from their cost, about 2% of the training time; estimated
	// from the state's size until a cut is measured).
	CheckpointEvery int `json:"checkpoint_every,omitempty"`
	// Replicas is the number of copies of each consistent cut and of the
	// job's record: the coordinator's own and Replicas-1 on other nodes
	// (0: DefaultReplicas; 1 to MaxReplicas). A job survives the loss of
	// its coordinator's node when Replicas >= 2.
	Replicas int `json:"replicas"`
	// Loss is what training minimises: "ce" (softmax cross-entropy against
	// class labels), "mse", "l1" or "huber" (squared, absolute or Huber
	// error against float targets of the output's shape) or "bce" (binary
	// cross-entropy of logits against targets in [0, 1]); empty: ce for
	// class labels, mse for float targets (LossName; nn.NewLoss).
	Loss string `json:"loss,omitempty"`
	// LabelSmoothing ε in [0, 1), with the ce loss, takes each label's
	// target as 1−ε on it and ε spread over the classes.
	LabelSmoothing float64 `json:"label_smoothing,omitempty"`
	// PosWeight, with the bce loss, weighs each positive target's term
	// (BCEWithLogitsLoss's pos_weight): one weight for every output, or
	// one for each along the output's last axis.
	PosWeight []float64 `json:"pos_weight,omitempty"`
	// ClassWeights, with the ce loss, weighs each label's loss by its
	// class's weight, one a class (CrossEntropyLoss's weight=): the mean
	// divides by the weights of the labels that count.
	ClassWeights []float64 `json:"class_weights,omitempty"`
	// Freeze keeps the parameters whose state_dict names start with one of
	// these prefixes out of training (requires_grad=False: fine-tuning a
	// part of a model loaded with Init).
	Freeze []string `json:"freeze,omitempty"`
	// PaddingIdx gives embedding tables (by state_dict name, "tok.weight")
	// a row their lookups give no gradient (nn.Embedding's padding_idx,
	// which an ONNX file does not hold).
	PaddingIdx map[string]int `json:"padding_idx,omitempty"`
	// ClipGradNorm, if positive, scales each step's gradients so that their
	// norm over the whole model is at most it (PyTorch's clip_grad_norm_).
	ClipGradNorm float64 `json:"clip_grad_norm,omitempty"`
	// EvalEachEpoch also measures test accuracy at every epoch's end, not
	// just at the job's.
	EvalEachEpoch bool `json:"eval_each_epoch,omitempty"`
	// EvalEvery, if positive, also measures them after every EvalEvery
	// steps (nanoGPT's eval_interval).
	EvalEvery int `json:"eval_every,omitempty"`
	// Wire is "" or "lossless" (each link picks its lossless codec for its
	// rate and what it carries), "raw" (no compression), or a lossy format
	// for the activations and gradients between stages: "bf16" or "int8" (a
	// scale per 64 values). Inputs, state moves and checkpoints stay
	// lossless.
	Wire string `json:"wire,omitempty"`
	// NoProbe plans every link as balance.DefaultLink (1 Gbit/s) without
	// measuring any.
	NoProbe bool `json:"no_probe,omitempty"`
}

// AutoCodecs reports whether links choose their lossless codecs.
func (s Spec) AutoCodecs() bool { return s.Wire != "raw" }

// WireCodec is the lossy codec of Wire, or raw for none.
func (s Spec) WireCodec() tensorio.Codec {
	if c, err := tensorio.ParseCodec(s.Wire); err == nil && !c.Lossless() {
		return c
	}
	return tensorio.CodecRaw
}

// DefaultSpec returns the defaults of `ppnode train`.
func DefaultSpec() Spec {
	return Spec{
		Model: "mlp32", Data: "mnist", Batch: 128, MicroBatches: 4, Epochs: 3,
		Optimizer: "adam", Momentum: 0.9, LRSchedule: "cosine", Warmup: -1, Seed: 1,
		Standardize: true, Partition: "auto", Schedule: "auto",
	}
}

// Bounds of a job spec.
const (
	MaxBatch            = 1 << 16
	MaxSyntheticSamples = 1 << 22
	DefaultReplicas     = 2
	MaxReplicas         = 8
	MaxChunks           = 16 // interleaved stages per node
)

// ErrSpec wraps every problem with a job spec.
var ErrSpec = errors.New("bad job spec")

func specErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrSpec, fmt.Sprintf(format, a...))
}

// Checked is a spec that [Check] normalised and validated. The coordinator,
// the record holders, the stages, the memory checks and Prepare take it
// instead of a Spec, so that a spec is checked once where it enters a
// process (a submission, or a record or stage spec decoded from the
// network: see UnmarshalJSON) and never again downstream. Only Check and
// UnmarshalJSON make one; the zero Checked is no job's.
type Checked struct{ s Spec }

// Check normalises s (fills the defaults that do not depend on the data)
// and checks everything that can be checked without loading the data. A
// bad spec is an error wrapping ErrSpec.
func Check(s Spec) (Checked, error) {
	s.Files = maps.Clone(s.Files)
	if err := s.normalize(); err != nil {
		return Checked{}, err
	}
	return Checked{s}, nil
}

// AutoMicroBatches reports whether the coordinator chooses the job's M.
func (c Checked) AutoMicroBatches() bool { return c.s.MicroBatches == 0 }

// WithMicroBatches returns c with m micro-batches. (What else Check
// refuses does not depend on M: auto is refused where it would.)
func (c Checked) WithMicroBatches(m int) (Checked, error) {
	if m < 1 || m > c.s.Batch {
		return Checked{}, specErr("need 1 <= micro-batches (%d) <= batch (%d)", m, c.s.Batch)
	}
	c.s.Files = maps.Clone(c.s.Files)
	c.s.MicroBatches = m
	return c, nil
}

// MaxAutoMicroBatches is the largest M that auto micro-batches try.
const MaxAutoMicroBatches = 32

// MostMicroBatches is the largest M up to MaxAutoMicroBatches that divides
// batch: the smallest micro-batches auto may choose.
func MostMicroBatches(batch int) int {
	for m := min(MaxAutoMicroBatches, batch); m > 1; m-- {
		if batch%m == 0 {
			return m
		}
	}
	return 1
}

// ReadingFrom returns c, reading its files through f (nil: by path).
func (c Checked) ReadingFrom(f *Files) Checked {
	c.s.files = f
	return c
}

// Spec returns a copy of the checked spec.
func (c Checked) Spec() Spec {
	s := c.s
	s.Files = maps.Clone(s.Files)
	return s
}

// ID is the job's id.
func (c Checked) ID() string { return c.s.ID }

// MarshalJSON writes the spec as a Spec.
func (c Checked) MarshalJSON() ([]byte, error) { return json.Marshal(c.s) }

// UnmarshalJSON reads a Spec, refusing unknown fields (a field of another
// ppnode version would be dropped, and the job run otherwise), and checks
// it as Check does. Errors wrap ErrSpec.
func (c *Checked) UnmarshalJSON(b []byte) error {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return specErr("%v", err)
	}
	cs, err := Check(s)
	if err != nil {
		return err
	}
	*c = cs
	return nil
}

// normalize fills the defaults that do not depend on the data and checks
// everything that can be checked without loading it: Check's work.
func (s *Spec) normalize() error {
	if !slices.Contains(zoo.Names(), s.Model) && !IsModelFile(s.Model) {
		return specErr("unknown model %q (have %s, or a .onnx file)", s.Model, strings.Join(zoo.Names(), ", "))
	}
	if IsModelFile(s.Model) && s.Width != 0 {
		return specErr("--width sizes the zoo's models, not an ONNX file's")
	}
	if s.Data == "" {
		return specErr("no data set")
	}
	if s.Batch < 1 || s.MicroBatches < 0 || s.MicroBatches > s.Batch {
		return specErr("need 1 <= micro-batches (%d) <= batch (%d), or 0: auto", s.MicroBatches, s.Batch)
	}
	if s.MicroBatches == 0 && s.Deterministic {
		return specErr("a deterministic job needs its number of micro-batches, not auto: they decide its weights")
	}
	if s.MicroBatches == 0 && s.Schedule == balance.Interleaved.String() {
		return specErr("interleaved needs its number of micro-batches, not auto (a multiple of the nodes)")
	}
	if s.Epochs < 0 || s.Steps < 0 || s.Epochs == 0 && s.Steps == 0 {
		return specErr("epochs %d and steps %d: need epochs >= 1, or steps >= 1 (epochs 0: as many as the steps need), or both", s.Epochs, s.Steps)
	}
	if s.Width < 0 || math.IsNaN(s.Width) || math.IsInf(s.Width, 0) {
		return specErr("width %v", s.Width)
	}
	// Bounds before anything is allocated: a spec comes from the network,
	// and a node must refuse what would exhaust its memory, not die of it.
	maxWidth := 16.0
	if s.Model == "mlp32" {
		maxWidth = 1 << 14
	}
	switch {
	case s.Width > maxWidth:
		return specErr("width %v is over %v for %s", s.Width, maxWidth, s.Model)
	case s.Batch > MaxBatch:
		return specErr("batch %d is over %d", s.Batch, MaxBatch)
	case s.SyntheticSamples < 0 || s.SyntheticSamples > MaxSyntheticSamples:
		return specErr("synthetic samples %d: want 0 to %d", s.SyntheticSamples, MaxSyntheticSamples)
	}
	switch s.Optimizer {
	case "adam", "adamw", "sgd":
	default:
		return specErr("unknown optimizer %q (have adam, adamw, sgd)", s.Optimizer)
	}
	if s.LR == 0 {
		s.LR = 0.005
		if nn.IsAdam(s.Optimizer) {
			s.LR = 3e-4
		}
	}
	if !(s.LR > 0) || math.IsInf(s.LR, 0) {
		return specErr("learning rate %v", s.LR)
	}
	if s.Threads < 0 || s.MaxNodes < 0 || s.CheckpointEvery < 0 {
		return specErr("negative threads, max nodes or checkpoint interval")
	}
	if s.Replicas == 0 {
		s.Replicas = DefaultReplicas
	}
	if s.Replicas < 1 || s.Replicas > MaxReplicas {
		return specErr("replicas %d: want 1 to %d copies of each cut", s.Replicas, MaxReplicas)
	}
	if s.Partition == "" {
		s.Partition = "auto"
	}
	if s.Schedule == "" {
		s.Schedule = "auto"
	}
	if err := balance.CheckSchedule(s.Schedule); err != nil && s.Schedule != "auto" {
		return specErr("%v", err)
	}
	if err := balance.CheckRecompute(s.Recompute); err != nil {
		return specErr("%v", err)
	}
	if err := s.checkInterleaved(); err != nil {
		return err
	}
	if _, err := nn.NewSchedule(s.LRSchedule, s.LR, s.MinLR, 0, 1); err != nil {
		return specErr("%v", err)
	}
	if s.Loss != "" && !slices.Contains(nn.LossNames(), s.Loss) {
		return specErr("unknown loss %q (have %s; none: %s for class labels, %s for float targets)", s.Loss, strings.Join(nn.LossNames(), ", "), nn.LossCE, nn.LossMSE)
	}
	if !(s.ClipGradNorm >= 0) || math.IsInf(s.ClipGradNorm, 0) {
		return specErr("gradient clipping at norm %v: want a positive number (0: none)", s.ClipGradNorm)
	}
	if !(s.LabelSmoothing >= 0 && s.LabelSmoothing < 1) {
		return specErr("label smoothing %v: want a value in [0, 1)", s.LabelSmoothing)
	}
	if s.EvalEvery < 0 {
		return specErr("evaluating every %d steps: want a number of steps (0: at the end)", s.EvalEvery)
	}
	if s.NoDecay1D && s.WeightDecay == 0 {
		return specErr("leaving one-dimensional tensors out of the weight decay needs a weight decay (--weight-decay)")
	}
	if err := checkWeights("positive weight", s.PosWeight); err != nil {
		return err
	}
	if s.PosWeight != nil && s.Loss != nn.LossBCE {
		return specErr("a positive weight is the %s loss's (--loss %s)", nn.LossBCE, nn.LossBCE)
	}
	if err := checkWeights("class weight", s.ClassWeights); err != nil {
		return err
	}
	if s.ClassWeights != nil && s.Loss != "" && s.Loss != nn.LossCE {
		return specErr("class weights are the %s loss's; the loss is %s", nn.LossCE, s.Loss)
	}
	if s.LabelSmoothing != 0 && s.Loss != "" && s.Loss != nn.LossCE {
		return specErr("label smoothing is the %s loss's; the loss is %s", nn.LossCE, s.Loss)
	}
	switch s.Wire {
	case "", "lossless", "raw", "bf16", "int8":
	default:
		return specErr("unknown wire format %q (have lossless, the default: each link chooses its codec; raw; bf16; int8)", s.Wire)
	}
	if s.WireCodec() != tensorio.CodecRaw && s.Deterministic {
		return specErr("wire format %s is lossy: a deterministic run would not give the weights of --local", s.Wire)
	}
	if err := nn.CheckBackend(s.Backend, s.Deterministic); err != nil {
		return specErr("%v", err)
	}
	return nil
}

// checkInterleaved refuses what the interleaved schedule does not run:
// fewer than 2 chunks, chunks under another schedule, replicated stages,
// the graph partitioner's DAGs of stages, recomputation, and micro-batches
// that are no multiple of --max-nodes. The planner refuses the rest with
// the model and the nodes at hand: M not a multiple of the nodes, a model
// whose stages do not form a chain, too few layers for nodes × chunks.
func (s *Spec) checkInterleaved() error {
	if s.Schedule != balance.Interleaved.String() {
		if s.Chunks != 0 {
			return specErr("%d chunks per node under the %s schedule: chunks are for the interleaved schedule", s.Chunks, s.Schedule)
		}
		return nil
	}
	switch {
	case s.Chunks < 0 || s.Chunks == 1:
		return specErr("interleaved with %d chunks per node: it needs 2 or more (0: chosen by the planner)", s.Chunks)
	case s.Chunks > MaxChunks:
		return specErr("interleaved with %d chunks per node: at most %d", s.Chunks, MaxChunks)
	case s.Partition == balance.GraphPP || s.Partition == balance.Params:
		return specErr("interleaved cuts the model into a chain of stages by time: partition auto, balanced or uniform, not %s", s.Partition)
	case strings.Contains(s.Partition, ","):
		return specErr("interleaved does not run replicated stages (the partition %q gives a stage several nodes)", s.Partition)
	case s.Recompute != "" && s.Recompute != balance.RecomputeNone:
		return specErr("interleaved does not recompute activations (recompute %s)", s.Recompute)
	case s.MicroBatches > 0 && s.MaxNodes > 0 && s.MicroBatches%s.MaxNodes != 0:
		return specErr("interleaved needs micro-batches in a multiple of the nodes: %d micro-batches on up to %d nodes", s.MicroBatches, s.MaxNodes)
	}
	return nil
}

// Job is a spec with its data loaded and its model built and initialised.
type Job struct {
	Spec          Spec
	Set           *data.Set
	Graph         *nn.Graph
	Loader        *data.Loader
	LR            nn.Schedule
	StepsPerEpoch int
	// Total is the number of steps the job runs.
	Total int
	// Mean and Std standardised the inputs, per channel (nil: not
	// standardised).
	Mean, Std []float64

	loss nn.Loss // counts targets (Targets)
}

// Targets is how many of the targets y count: all but the ignored labels
// (nn.IgnoreLabel).
func (j *Job) Targets(y []float32) int { return j.loss.Count(y) }

// Mass is what the job's mean loss over the targets y divides by: Targets,
// or under class weights their labels' weights summed (nn.Loss).
func (j *Job) Mass(y []float32) float64 { return j.loss.Mass(y) }

// TestMass is what the mean loss over the test split divides by, summed
// chunk by chunk as Evaluate sums it (nn.Trainer.Evaluate).
func (j *Job) TestMass() float64 {
	test, chunk := j.Set.Test, j.EvalChunk()
	L := test.Labels()
	var m float64
	for i := range test.EvalChunks(chunk) {
		m += j.Mass(test.Y[i*chunk*L : min((i+1)*chunk, test.N)*L])
	}
	return m
}

// Prepare checks that what this process allocates for the job fits this
// machine's memory (see PrepareWithin), loads the data and builds the
// model with its initial weights.
func (c Checked) Prepare() (*Job, error) { return c.PrepareWithin(AvailableMemory()) }

// PrepareWithin is Prepare in a process that may allocate memory bytes (0:
// unknown): a job whose Footprint.Local is over it is refused (ErrSpec)
// before anything is allocated for it. A spec that cannot be estimated
// goes on: loading its data or building its model says what is wrong.
func (c Checked) PrepareWithin(memory int64) (*Job, error) {
	return c.prepare(memory, checkLocal)
}

// PrepareToCoordinate is Prepare for a pipelined job's coordinator, which
// trains nothing itself: its share of this process is Footprint.Driver and
// a profile's window of layers.
func (c Checked) PrepareToCoordinate() (*Job, error) {
	return c.prepare(AvailableMemory(), checkDriver)
}

func (c Checked) prepare(memory int64, check func(Footprint, int64) error) (*Job, error) {
	s := c.Spec()
	if f, err := c.Estimate(); err == nil {
		if err := check(f, memory); err != nil {
			return nil, err
		}
	}
	if err := s.checkFile(s.Data); err != nil {
		return nil, err
	}
	set, err := data.Load(s.Data, data.Options{Seed: s.Seed, Train: s.SyntheticSamples, Open: s.open})
	if err != nil {
		if data.IsFile(s.Data) {
			return nil, specErr("%v", err) // the user's file
		}
		return nil, err
	}
	g, md, err := s.buildModel(SampleOf(set))
	if err != nil {
		return nil, err
	}
	if err := s.checkTargets(set, md); err != nil {
		return nil, err
	}
	var mean, std []float64
	if s.Standardize {
		for k, ch := range md.channels {
			if ch < 0 {
				continue
			}
			m, d := set.StandardizeInput(k, ch)
			if k == 0 {
				mean, std = m, d
			}
		}
	}
	if s.MicroBatches == 0 {
		return nil, specErr("micro-batches auto: the coordinator chooses them on a cluster (train --via); name a number to train here")
	}
	g.Init(s.Seed)
	loader, err := data.NewLoader(set.Train, s.Seed, s.Batch, s.MicroBatches)
	if err != nil {
		return nil, specErr("%v", err)
	}
	spe := loader.StepsPerEpoch()
	if spe == 0 {
		return nil, specErr("batch %d is larger than the %d training samples", s.Batch, set.Train.N)
	}
	total := TotalSteps(s.Epochs, s.Steps, spe)
	if s.Warmup < 0 {
		s.Warmup = min(150, total/5)
	}
	sched, err := nn.NewSchedule(s.LRSchedule, s.LR, s.MinLR, s.Warmup, total)
	if err != nil {
		return nil, specErr("%v", err)
	}
	return &Job{Spec: s, Set: set, Graph: g, Loader: loader, LR: sched, StepsPerEpoch: spe, Total: total, Mean: mean, Std: std,
		loss: s.NewLoss(SampleOf(set), 1)}, nil
}

// TotalSteps is the length in steps of a job of epochs epochs of
// stepsPerEpoch steps and steps steps: the smaller of the two bounds, or
// the one that is not 0 (see Spec.Epochs).
func TotalSteps(epochs, steps, stepsPerEpoch int) int {
	switch {
	case epochs == 0:
		return steps
	case steps == 0:
		return epochs * stepsPerEpoch
	}
	return min(epochs*stepsPerEpoch, steps)
}

// HashFiles records in Files the SHA-256 of the model, data and initial
// weights files the spec names.
func (s *Spec) HashFiles() error {
	files := []string{s.Init}
	if IsModelFile(s.Model) {
		files = append(files, s.Model)
	}
	if data.IsFile(s.Data) {
		files = append(files, s.Data)
	}
	for _, f := range files {
		if f == "" {
			continue
		}
		sum, err := s.fileSHA256(f)
		if err != nil {
			return specErr("%v", err)
		}
		if s.Files == nil {
			s.Files = map[string]string{}
		}
		s.Files[f] = sum
	}
	return nil
}

// checkFile refuses a file whose contents are not those Files recorded.
func (s Spec) checkFile(path string) error {
	want, ok := s.Files[path]
	if !ok || path == "" {
		return nil
	}
	got, err := s.fileSHA256(path)
	if err != nil {
		return specErr("%v", err)
	}
	if got != want {
		// Neither digest is shown: the file's would tell a user who
		// cannot read it whether a guess of its contents is right.
		return specErr("%s on this node is not the file the job was submitted with (their SHA-256 differ): every node needs the same file at the same path", path)
	}
	return nil
}

// loadONNX reads and parses the spec's ONNX model file.
func (s Spec) loadONNX() (*onnxpb.ModelProto, error) {
	f, err := s.open(s.Model)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return onnx.LoadFrom(f, s.Model)
}

// open opens a file the spec names.
func (s Spec) open(path string) (*os.File, error) {
	if s.files != nil {
		return s.files.Open(path)
	}
	return os.Open(path)
}

func (s Spec) fileSHA256(path string) (string, error) {
	f, err := s.open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// IsModelFile reports whether model names an ONNX file.
func IsModelFile(model string) bool { return strings.HasSuffix(strings.ToLower(model), ".onnx") }

// Sample describes what a data set feeds a model: its inputs, the shape
// of a sample's labels and the classes.
type Sample struct {
	Inputs  []onnx.Input `json:"inputs"`
	Labels  []int        `json:"labels,omitempty"`
	Classes int          `json:"classes"`
}

// SampleOf describes set's samples.
func SampleOf(set *data.Set) Sample {
	var ins []onnx.Input
	for _, a := range set.Train.Inputs() {
		ins = append(ins, onnx.Input{Name: a.Name, Shape: a.Shape, Int: a.Int})
	}
	return Sample{Inputs: ins, Labels: set.Train.LabelShape, Classes: set.Classes}
}

// BuildModel builds the spec's model for the data's samples. Its
// parameters start (at Graph.Init) from the seed, or from the ONNX file's
// initializers, or from the Init file.
func (s Spec) BuildModel(d Sample) (*nn.Graph, error) {
	g, _, err := s.buildModel(d)
	return g, err
}

// built says what buildModel learnt of a model besides its graph.
type built struct {
	channels []int // per input, the axis standardisation works per (-1: none)
	labels   []int // the per-sample shape of the class labels it takes
	output   []int // the per-sample shape of its output
}

// LossName is the loss the job minimises on data d: the spec's, or the
// softmax cross-entropy for class labels and the squared error for float
// targets.
func (s Spec) LossName(d Sample) string {
	switch {
	case s.Loss != "":
		return s.Loss
	case d.Classes == 0:
		return nn.LossMSE
	}
	return nn.LossCE
}

// NewLoss returns the job's loss (LossName) over threads.
func (s Spec) NewLoss(d Sample, threads int) nn.Loss {
	l, err := nn.NewLoss(s.LossName(d), threads)
	if err != nil {
		panic(err) // a checked spec names a known loss
	}
	if ce, ok := l.(*nn.SoftmaxCE); ok {
		ce.Smoothing = float32(s.LabelSmoothing)
		if s.ClassWeights != nil {
			ce.Weights = float32s(s.ClassWeights)
		}
	}
	if s.PosWeight != nil {
		l = nn.NewBCE(threads, float32s(s.PosWeight))
	}
	return l
}

// checkWeights refuses a weight that is not a float32 from 0 up.
func checkWeights(what string, ws []float64) error {
	for i, w := range ws {
		if !(w >= 0 && w <= math.MaxFloat32) {
			return specErr("%s %d is %v: want a number from 0 up", what, i, w)
		}
	}
	return nil
}

func float32s(v []float64) []float32 {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	return f
}

// checkTargets refuses data whose targets the model's output cannot be
// scored against with the job's loss.
func (s Spec) checkTargets(set *data.Set, md built) error {
	y := set.Train.LabelShape
	loss := s.LossName(SampleOf(set))
	if loss != nn.LossCE && set.Classes > 0 && (slices.Contains(set.Train.Y, nn.IgnoreLabel) || slices.Contains(set.Test.Y, nn.IgnoreLabel)) {
		return specErr("the data's y has labels %d, which only the loss %s ignores (loss %s)", nn.IgnoreLabel, nn.LossCE, loss)
	}
	switch {
	case s.LabelSmoothing != 0 && loss != nn.LossCE:
		return specErr("label smoothing is the %s loss's; float targets take %s", nn.LossCE, loss)
	case s.ClassWeights != nil && loss != nn.LossCE:
		return specErr("class weights are the %s loss's; float targets take %s", nn.LossCE, loss)
	case len(s.PosWeight) > 1 && (len(md.output) == 0 || md.output[len(md.output)-1] != len(s.PosWeight)):
		return specErr("%d positive weights for the model's output %s: want one, or one a value of its last axis", len(s.PosWeight), batchShape(md.output))
	case loss == nn.LossCE && set.Classes == 0:
		return specErr("loss %s needs class labels (y of integers); the data's y holds floats: a regression's targets (loss %s, %s, %s or %s)", loss, nn.LossMSE, nn.LossL1, nn.LossHuber, nn.LossBCE)
	case loss == nn.LossCE && slices.Equal(md.labels, y):
		return s.enoughClasses(md.output[len(md.output)-1], set.Classes)
	case loss == nn.LossCE && len(md.output) > 1 && slices.Equal(md.output[1:], y):
		// Classes on axis 1, a label a position (a segmentation's).
		if c := md.output[0]; c == md.output[len(md.output)-1] {
			return specErr("the model's logits %s could hold the %d classes on axis 1 or on the last axis; make them differ in size (the data's y is %s)",
				batchShape(md.output), c, batchShape(y))
		}
		return s.enoughClasses(md.output[0], set.Classes)
	case loss == nn.LossCE:
		return specErr("the model gives %v labels a sample (logits of shape [N, %s classes]); the data's y has %v",
			orNone(md.labels), dimsPrefix(md.labels), orNone(y))
	case loss != nn.LossCE && !slices.Equal(squeezed(md.output), squeezed(y)):
		return specErr("loss %s scores each output value against a target: the model's output is %s, the data's y is %s",
			loss, batchShape(md.output), batchShape(y))
	}
	return nil
}

// enoughClasses requires logits for the data's classes, and a class weight
// for each logit if there are weights.
func (s Spec) enoughClasses(outputs, classes int) error {
	if outputs < classes {
		return specErr("the model has %d outputs; the data has %d classes", outputs, classes)
	}
	if s.ClassWeights != nil && len(s.ClassWeights) != outputs {
		return specErr("%d class weights for a model of %d classes: want one a class", len(s.ClassWeights), outputs)
	}
	return nil
}

// squeezed is shape without its axes of 1.
func squeezed(shape []int) []int {
	return slices.DeleteFunc(slices.Clone(shape), func(d int) bool { return d == 1 })
}

// batchShape writes a per-sample shape with the batch first: [N, 5].
func batchShape(shape []int) string {
	parts := []string{"N"}
	for _, d := range shape {
		parts = append(parts, strconv.Itoa(d))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// buildModel is BuildModel that also says where each input's channels are
// and what labels the model takes.
func (s Spec) buildModel(d Sample) (*nn.Graph, built, error) {
	for _, f := range []string{s.Model, s.Init} {
		if err := s.checkFile(f); err != nil {
			return nil, built{}, err
		}
	}
	if len(d.Inputs) == 0 {
		return nil, built{}, specErr("the data has no input")
	}
	var g *nn.Graph
	b := built{channels: []int{len(d.Inputs[0].Shape) - 1}}
	if IsModelFile(s.Model) {
		m, err := s.loadONNX()
		if err != nil {
			return nil, built{}, specErr("%v", err)
		}
		md, err := onnx.Import(m, onnx.Options{Inputs: d.Inputs})
		if err != nil {
			return nil, built{}, specErr("%s: %v", s.Model, err)
		}
		g, b = md.Graph, built{channels: md.ChannelAxes, labels: md.Labels, output: append(slices.Clone(md.Labels), md.Classes)}
	} else {
		if d.Classes == 0 {
			return nil, built{}, specErr("%s is a classifier: float targets need a model of yours (an ONNX file)", s.Model)
		}
		if len(d.Inputs) != 1 || d.Inputs[0].Int {
			return nil, built{}, specErr("%s takes one array of features; the data has %s", s.Model, describeInputs(d.Inputs))
		}
		var err error
		if g, err = zoo.Build(s.Model, zoo.Options{Width: s.Width, Input: d.Inputs[0].Shape, Classes: d.Classes}); err != nil {
			return nil, built{}, specErr("%v", err)
		}
		b.labels, b.output = []int{}, []int{d.Classes}
	}
	if s.Init != "" {
		if err := s.giveWeights(g, s.Init); err != nil {
			return nil, built{}, specErr("--init %s: %v", s.Init, err)
		}
	}
	if s.Freeze != nil {
		if err := g.Freeze(s.Freeze); err != nil {
			return nil, built{}, specErr("--freeze: %v", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.PaddingIdx)) {
		if err := g.SetPadding(name, s.PaddingIdx[name]); err != nil {
			return nil, built{}, specErr("--padding-idx: %v", err)
		}
	}
	return g, b, nil
}

func describeInputs(ins []onnx.Input) string {
	var parts []string
	for _, in := range ins {
		kind := "features"
		if in.Int {
			kind = "ids"
		}
		parts = append(parts, fmt.Sprintf("%s (%s of shape %v)", in.Name, kind, in.Shape))
	}
	return strings.Join(parts, ", ")
}

func orNone(s []int) any {
	if len(s) == 0 {
		return "one"
	}
	return s
}

// dimsPrefix writes a label shape as the dimensions before the classes.
func dimsPrefix(s []int) string {
	var out string
	for _, d := range s {
		out += strconv.Itoa(d) + ", "
	}
	return out
}

// giveWeights makes the weights in the safetensors file at path the
// graph's initial ones. Every parameter and buffer must be there with its
// exported shape; a name the model lacks is refused, except PyTorch's
// num_batches_tracked.
func (s Spec) giveWeights(g *nn.Graph, path string) error {
	f, err := s.open(path)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return err
	}
	ts, _, err := tensorio.ReadSafetensors(b)
	if err != nil {
		return err
	}
	byName := map[string]*nn.Tensor{}
	for _, t := range ts {
		byName[t.Name] = t.T
	}
	var missing []string
	have := map[string]bool{}
	for _, p := range g.Params() {
		have[p.Name] = true
		for _, a := range p.Aliases {
			have[a] = true
		}
		if _, ok := byName[p.Name]; !ok {
			missing = append(missing, p.Name)
		}
	}
	var extra []string
	for _, t := range ts {
		if !have[t.Name] && !strings.HasSuffix(t.Name, ".num_batches_tracked") {
			extra = append(extra, t.Name)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		return fmt.Errorf("the file is not of this model: it lacks %s and has %s besides", list(missing), list(extra))
	}
	for _, p := range g.Params() {
		t := byName[p.Name]
		v, err := p.FromExported(nn.F32(t), t.Shape())
		if err != nil {
			return fmt.Errorf("%w (is the file of a model of another size?)", err)
		}
		p.Given = v
	}
	return nil
}

// list names up to five items of a list.
func list(names []string) string {
	switch {
	case len(names) == 0:
		return "nothing"
	case len(names) > 5:
		return fmt.Sprintf("%s and %d more", strings.Join(names[:5], ", "), len(names)-5)
	}
	return strings.Join(names, ", ")
}

// NewOptimizer returns the spec's optimizer at its base learning rate.
func (s Spec) NewOptimizer(threads int) (nn.Optimizer, error) {
	return nn.NewOptimizer(nn.OptimizerConfig{Name: s.Optimizer, LR: s.LR, Momentum: s.Momentum, WeightDecay: s.WeightDecay,
		NoDecay1D: s.NoDecay1D, Threads: threads})
}

// NewBackend returns the spec's GEMM backend with threads threads (0:
// the spec's, else all CPUs).
func (s Spec) NewBackend(threads int) (nn.Backend, error) {
	if s.Threads > 0 {
		threads = s.Threads
	}
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	return nn.NewBackend(s.Backend, threads, s.Deterministic)
}

// NewTrainer returns a single-process trainer of the job's model with its
// loss.
func (j *Job) NewTrainer(opt nn.Optimizer, be nn.Backend) *nn.Trainer {
	tr := nn.NewTrainer(j.Graph, opt, be, j.Spec.Seed)
	tr.Loss = j.Spec.NewLoss(SampleOf(j.Set), be.Threads())
	tr.ClipNorm = j.Spec.ClipGradNorm
	return tr
}

// Evaluate returns the accuracy and the mean loss of tr's model on the
// job's test split (per label: per sample, or per position), and under the
// binary cross-entropy the AUC of its outputs (Job.AUC; 0 otherwise).
// progress, if set, hears after each chunk how many of the split's samples
// are done.
func (j *Job) Evaluate(tr *nn.Trainer, progress func(done, samples int)) (accuracy, loss, auc float64) {
	test := j.Set.Test
	chunk := j.EvalChunk()
	var scores []float32
	var keep func(out *nn.Tensor)
	if j.RanksScores() {
		scores = make([]float32, 0, len(test.Y))
		keep = func(out *nn.Tensor) { scores = append(scores, nn.F32(out)...) }
	}
	i := 0
	accuracy, loss = tr.Evaluate(func(b *nn.Batch) bool {
		if progress != nil && i > 0 {
			progress(min(i*chunk, test.N), test.N)
		}
		if i >= test.EvalChunks(chunk) {
			return false
		}
		test.EvalChunk(i, chunk, b)
		i++
		return true
	}, keep)
	return accuracy, loss, j.AUC(scores)
}

// RanksScores reports whether the evaluations of a job on data like d give
// an AUC: its loss is the binary cross-entropy, whose outputs are scores
// of 0/1 targets.
func (s Spec) RanksScores(d Sample) bool { return s.LossName(d) == nn.LossBCE }

// RanksScores is Spec.RanksScores for the job's data.
func (j *Job) RanksScores() bool { return j.Spec.RanksScores(SampleOf(j.Set)) }

// AUC is the area under the ROC curve of the test split's outputs, in
// sample order, against its targets (nn.AUC over every value, as
// scikit-learn's roc_auc_score of the flattened arrays), or 0 where there
// is none: not a job that RanksScores, targets that are not all 0 or 1 or
// are of one class, or outputs not one a target.
func (j *Job) AUC(scores []float32) float64 {
	y := j.Set.Test.Y
	if !j.RanksScores() || len(scores) != len(y) {
		return 0
	}
	if a := nn.AUC(scores, y); !math.IsNaN(a) {
		return a
	}
	return 0
}

// EvalChunk is how many test samples Evaluate runs at a time, as Estimate
// counts them: every layer's output of a chunk may be live at once, and a
// convolution's columns. A pipelined evaluation cuts the split the same
// way and sums the chunks' losses in the same order.
func (j *Job) EvalChunk() int {
	var w shapes
	w.graph(j.Graph)
	return evalChunkOf(w.evalBytes())
}

// Result is the outcome of a job: the final JSON line of `ppnode train`
// (local runs leave Plan, Schedule and Nodes empty).
type Result struct {
	ID            string  `json:"id,omitempty"`
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
	// TestLoss is the mean loss over the test split's labels; Perplexity
	// its exponential, for models with a label a position (language
	// models).
	TestLoss   float64 `json:"test_loss"`
	Perplexity float64 `json:"perplexity,omitempty"`
	// TestAUC is the final weights' AUC under the binary cross-entropy
	// (Job.AUC).
	TestAUC float64 `json:"test_auc,omitempty"`
	// Loss names the loss (Spec.LossName); under mse, l1 and huber there
	// is no accuracy (nn.LossScores), and both accuracies are 0.
	Loss          string  `json:"loss,omitempty"`
	Backend       string  `json:"backend"`
	Threads       int     `json:"threads"`
	Deterministic bool    `json:"deterministic"`
	Seconds       float64 `json:"seconds"`
	// EvalSeconds is how long the final evaluation of the test split
	// took; EvaluatedOn where it ran on a cluster: "stages" (the pipeline,
	// forward only) or "coordinator" (its node alone, when the stages
	// could not).
	EvalSeconds   float64  `json:"eval_seconds,omitempty"`
	EvaluatedOn   string   `json:"evaluated_on,omitempty"`
	WeightsSHA256 string   `json:"weights_sha256"`
	Plan          string   `json:"plan,omitempty"`
	Schedule      string   `json:"schedule,omitempty"`
	Nodes         []string `json:"nodes,omitempty"`
	// PredictedStepMS is the simulator's step time for the plan (pipelined
	// jobs only), MeasuredStepMS the median measured one.
	PredictedStepMS float64 `json:"predicted_step_ms,omitempty"`
	MeasuredStepMS  float64 `json:"measured_step_ms,omitempty"`
	// LossHistory is the training loss over the steps, downsampled to at
	// most MaxLossPoints (see LossHistory); JSON [[step, loss], ...]. A
	// job taken over by another node has the steps since the cut it
	// resumed from.
	LossHistory []LossPoint `json:"loss_history,omitempty"`
	// Evaluations are the test split's evaluations, the last one's
	// included (Spec.EvalEachEpoch, Spec.EvalEvery).
	Evaluations []EvalResult `json:"evaluations,omitempty"`
}

// EvalDue reports whether the test split is evaluated once next steps are
// done and before the next one (after the job's last step it always is).
func (j *Job) EvalDue(next int) bool {
	s := j.Spec
	return next < j.Total && (s.EvalEachEpoch && next%j.StepsPerEpoch == 0 || s.EvalEvery > 0 && next%s.EvalEvery == 0)
}

// LocalHooks are what TrainLocal tells as it goes; each may be nil.
type LocalHooks struct {
	// Step follows every step: steps done, its loss, samples/s so far.
	Step func(step int, loss, samplesPerSec float64)
	// Evaluating follows every chunk of an evaluation (Evaluate);
	// Evaluated each evaluation before the last (EvalDue).
	Evaluating func(step, done, samples int)
	Evaluated  func(EvalResult)
}

// TrainLocal trains the job in this process with the single-process
// reference trainer (`ppnode train --local`): the result a pipelined run of
// the same spec must reproduce. A loss that becomes NaN or infinite ends
// it with an error wrapping ErrDiverged (see CheckLoss).
func (j *Job) TrainLocal(threads int, hooks LocalHooks) (*Result, error) {
	s := j.Spec
	be, err := s.NewBackend(threads)
	if err != nil {
		return nil, err
	}
	opt, err := s.NewOptimizer(be.Threads())
	if err != nil {
		return nil, err
	}
	tr := j.NewTrainer(opt, be)
	start := time.Now()
	var last nn.StepResult
	var correct, seen int
	var losses LossHistory
	var evals []EvalResult
	steps := make([]float64, 0, min(j.Total, 1<<20))
	for g := 0; g < j.Total; g++ {
		t0 := time.Now()
		opt.SetLR(j.LR.At(g))
		last = tr.Step(j.Loader, g/j.StepsPerEpoch, g%j.StepsPerEpoch, g)
		if err := CheckLoss(g, last.Loss); err != nil {
			return nil, err
		}
		steps = append(steps, time.Since(t0).Seconds())
		losses.Add(g+1, last.Loss)
		correct += last.Correct
		seen += last.Samples
		if hooks.Step != nil {
			hooks.Step(g+1, last.Loss, float64((g+1)*s.Batch)/time.Since(start).Seconds())
		}
		if j.EvalDue(g + 1) {
			t0 := time.Now()
			e := j.evaluateAt(tr, g+1, hooks.Evaluating)
			evals = append(evals, e)
			start = start.Add(time.Since(t0)) // samples/s counts training
			if hooks.Evaluated != nil {
				hooks.Evaluated(e)
			}
		}
	}
	elapsed := time.Since(start).Seconds()
	t0 := time.Now()
	final := j.evaluateAt(tr, j.Total, hooks.Evaluating)
	evalSeconds := time.Since(t0).Seconds()
	return &Result{
		ID: s.ID, Model: s.Model, Data: s.Data, Params: j.Graph.ParamCount(), Steps: j.Total,
		Epochs: float64(j.Total) / float64(j.StepsPerEpoch), Batch: s.Batch, MicroBatches: s.MicroBatches,
		SamplesPerSec: float64(j.Total*s.Batch) / elapsed, TrainLoss: last.Loss,
		TrainAccuracy: float64(correct) / float64(max(seen, 1)), TestAccuracy: final.Accuracy, TestLoss: final.TestLoss,
		Perplexity: final.Perplexity, TestAUC: final.AUC, Loss: j.LossName(),
		Backend: nn.Describe(be), Threads: be.Threads(), Deterministic: s.Deterministic, Seconds: elapsed,
		EvalSeconds: evalSeconds, WeightsSHA256: nn.WeightsSHA256(j.Graph.Params()), MeasuredStepMS: balance.Median(steps) * 1e3,
		LossHistory: losses.Points(), Evaluations: append(evals, final),
	}, nil
}

// evaluateAt evaluates the weights after step on the test split.
func (j *Job) evaluateAt(tr *nn.Trainer, step int, evaluating func(step, done, samples int)) EvalResult {
	var progress func(done, samples int)
	if evaluating != nil {
		progress = func(done, samples int) { evaluating(step, done, samples) }
	}
	acc, loss, auc := j.Evaluate(tr, progress)
	return j.EvalResult(step, acc, loss, auc)
}

// EvalResult is the record of an evaluation of the weights after step;
// its epoch and perplexity follow from the step and the loss.
func (j *Job) EvalResult(step int, accuracy, loss, auc float64) EvalResult {
	return EvalResult{Step: step, Epoch: j.EpochOf(step), Accuracy: accuracy, TestLoss: loss, Perplexity: j.Perplexity(loss), AUC: auc}
}

// EpochOf is the epoch that steps done fall in, 1 for the first (a
// partial epoch counts).
func (j *Job) EpochOf(steps int) int { return (steps + j.StepsPerEpoch - 1) / j.StepsPerEpoch }

// Perplexity is exp(loss) for a model with a class label a position (a
// language model's), else 0.
func (j *Job) Perplexity(loss float64) float64 {
	if len(j.Set.Train.LabelShape) == 0 || j.LossName() != nn.LossCE {
		return 0
	}
	return math.Exp(loss)
}

// LossName is the loss the job minimises (Spec.LossName).
func (j *Job) LossName() string { return j.Spec.LossName(SampleOf(j.Set)) }

// ScoresAccuracy reports whether the job's loss counts predictions, so
// that its evaluations give an accuracy (nn.LossScores).
func (j *Job) ScoresAccuracy() bool { return nn.LossScores(j.LossName()) }

// WeightsMeta is the metadata of a safetensors file of the job's final
// weights (WeightsEntries): what a user needs to use them elsewhere (the
// model, its input shape and classes, the inputs' standardisation, the
// steps and seed) and their fingerprint.
func (j *Job) WeightsMeta(res Result) map[string]string {
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	m := map[string]string{
		"format":         "pt",
		"model":          res.Model,
		"data":           j.Spec.Data,
		"input_shape":    js(j.Set.Train.Shape),
		"classes":        strconv.Itoa(j.Set.Classes),
		"steps":          fmt.Sprint(res.Steps),
		"seed":           strconv.FormatUint(j.Spec.Seed, 10),
		"layout":         "PyTorch state_dict: linear weights [out, in], conv2d [out, in, kh, kw]",
		"weights_sha256": res.WeightsSHA256,
	}
	if j.Spec.Width != 0 { // else the model's default
		m["width"] = strconv.FormatFloat(j.Spec.Width, 'g', -1, 64)
	}
	if j.Mean != nil {
		m["input_mean"], m["input_std"] = js(j.Mean), js(j.Std)
	}
	return m
}
