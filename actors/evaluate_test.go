package actors

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
	"google.golang.org/protobuf/proto"
)

// evalControl records the stages' answers to EvalBegin; kill, if set, is
// called before each EvalBegin is sent.
type evalControl struct {
	Control
	mu      sync.Mutex
	replies []*StepDone
	errs    []error
	kill    func(to StageRef)
}

func (e *evalControl) Request(to StageRef, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	_, eval := msg.(*EvalBegin)
	if eval && e.kill != nil {
		e.kill(to)
	}
	r, err := e.Control.Request(to, msg, timeout)
	if eval {
		e.mu.Lock()
		d, _ := r.(*StepDone)
		e.replies, e.errs = append(e.replies, d), append(e.errs, err)
		e.mu.Unlock()
	}
	return r, err
}

// The stages evaluate the test split themselves, at the first epoch's end
// and the job's: more chunks than micro-batches, a stage with replicas,
// stages that recompute (vgg16: BatchNorm and dropout), the accuracy and
// loss of one process, bit for bit, and training goes on after the first
// evaluation to the weights of one process.
func TestEvaluationRunsOnTheStages(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	for _, c := range []struct{ model, partition, recompute string }{
		{"mlp32", "fc1-fc12@a,b; fc13-fc32@c", ""},
		{"vgg16", "uniform", "all"},
	} {
		if testing.Short() && c.model != "mlp32" { // the race detector's pass: the replicated plan
			continue
		}
		t.Run(c.model, func(t *testing.T) {
			spec := smallSpec(c.model)
			spec.ID, spec.MicroBatches, spec.Partition, spec.Recompute = "job-eval-"+c.model, 2, c.partition, c.recompute
			spec.Epochs, spec.Steps, spec.EvalEachEpoch = 2, 0, true
			local := jobtest.Local(t, spec)
			ctl := &evalControl{Control: tc.ctl}
			cfg := tc.config(3)
			cfg.Control = ctl
			res, co := runJob(t, spec, cfg, nil)
			if n := len(co.Plan().Stages); len(ctl.replies) != 2*n {
				t.Fatalf("%d answers to EvalBegin, want two from each of %d stages", len(ctl.replies), n)
			}
			if res.WeightsSHA256 != local.WeightsSHA256 {
				t.Fatalf("weights %.16s, single process %.16s", res.WeightsSHA256, local.WeightsSHA256)
			}
			chunks := 0
			for k, d := range ctl.replies {
				if ctl.errs[k] != nil || d == nil || d.GetError() != "" {
					t.Fatalf("stage answer %d: %v, %v", k, d, ctl.errs[k])
				}
				chunks += len(d.GetChunkLoss())
			}
			j, err := jobtest.Check(t, spec).Prepare()
			if err != nil {
				t.Fatal(err)
			}
			if want := 2 * j.Set.Test.EvalChunks(j.EvalChunk()); chunks != want || want <= 2*spec.MicroBatches {
				t.Fatalf("the loss stage reported %d chunks, the test split has %d (want more than %d micro-batches)", chunks, want, 2*spec.MicroBatches)
			}
			if res.TestAccuracy != local.TestAccuracy || math.Float64bits(res.TestLoss) != math.Float64bits(local.TestLoss) || res.EvaluatedOn != "stages" {
				t.Fatalf("test accuracy %v and loss %v on the %s, single process %v and %v", res.TestAccuracy, res.TestLoss, res.EvaluatedOn, local.TestAccuracy, local.TestLoss)
			}
			if len(res.Evaluations) != 2 || !slices.Equal(res.Evaluations, local.Evaluations) {
				t.Fatalf("evaluations %+v, single process %+v", res.Evaluations, local.Evaluations)
			}
		})
	}
}

// Evaluations every few steps (--eval-every) run on the stages between
// steps and give one process's figures at the same steps, bit for bit,
// without changing the weights.
func TestEvaluationsEveryFewSteps(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	spec := smallSpec("mlp32")
	spec.ID, spec.Partition, spec.Steps, spec.Epochs = "job-eval-every", "uniform", 10, 0
	plain := jobtest.Local(t, spec)
	spec.EvalEvery = 4
	local := jobtest.Local(t, spec)
	res, _ := runJob(t, spec, tc.config(3), nil)
	steps := func(es []job.EvalResult) (s []int) {
		for _, e := range es {
			s = append(s, e.Step)
		}
		return s
	}
	if got := steps(local.Evaluations); !slices.Equal(got, []int{4, 8, 10}) || local.WeightsSHA256 != plain.WeightsSHA256 {
		t.Fatalf("one process evaluated after steps %v, weights %.16s (without: %.16s)", got, local.WeightsSHA256, plain.WeightsSHA256)
	}
	if !slices.Equal(res.Evaluations, local.Evaluations) || res.WeightsSHA256 != local.WeightsSHA256 {
		t.Fatalf("evaluations %+v, weights %.16s; one process %+v, %.16s", res.Evaluations, res.WeightsSHA256, local.Evaluations, local.WeightsSHA256)
	}
}

// A stage that dies as the evaluation begins leaves the coordinator to
// evaluate the gathered weights itself: the job still ends with one
// process's figures.
func TestEvaluationFallsBackToTheCoordinator(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	spec := smallSpec("mlp32")
	spec.ID, spec.Partition = "job-eval-dies", "uniform"
	local := jobtest.Local(t, spec)
	ctl := &evalControl{Control: tc.ctl}
	var once sync.Once
	ctl.kill = func(StageRef) { once.Do(func() { tc.kill(2) }) }
	cfg := tc.config(3)
	cfg.Control = ctl
	res, _ := runJob(t, spec, cfg, nil)
	if res.EvaluatedOn != "coordinator" {
		t.Errorf("evaluated on the %s, want the coordinator", res.EvaluatedOn)
	}
	if res.TestAccuracy != local.TestAccuracy || math.Float64bits(res.TestLoss) != math.Float64bits(local.TestLoss) || res.WeightsSHA256 != local.WeightsSHA256 {
		t.Fatalf("result %+v, single process %+v", res, local)
	}
}

// An EvalBegin out of bounds gets an error, and the stage stays usable.
func TestEvaluationRefusesBadRequests(t *testing.T) {
	tc := newInmemCluster(t, 2, nil)
	c, s, _ := startUniform(t, tc, "eval-bad")
	defer c.stopStages(s, true)
	h := &Header{JobId: "eval-bad", Generation: s.gen}
	for _, bad := range []*EvalBegin{
		{Header: h, Chunks: 4, Window: 0},
		{Header: h, Chunks: 4, Window: maxEvalWindow + 1},
		{Header: h, Chunks: evalTag, Window: 1},
	} {
		r, err := tc.ctl.Request(s.refs[0], bad, 5*time.Second)
		d, _ := r.(*StepDone)
		if err != nil || d == nil || d.GetError() == "" {
			t.Errorf("EvalBegin %v: reply %v, %v; want an error", bad, r, err)
		}
	}
	if _, _, _, err := c.evaluate(t.Context(), s, 0, nil); err != nil {
		t.Fatalf("an evaluation after the bad requests: %v", err)
	}
}

// A StepBegin whose loss mass is not a finite number from 0 up gets an
// error before the stage computes anything, and the stage stays usable.
func TestStepRefusesBadNumbers(t *testing.T) {
	tc := newInmemCluster(t, 2, nil)
	c, s, _ := startUniform(t, tc, "step-bad")
	defer c.stopStages(s, true)
	h := &Header{JobId: "step-bad", Generation: s.gen}
	for _, bad := range []*StepBegin{
		{Header: h, MicroBatches: uint32(c.spec.MicroBatches), Lr: 0.1, Mass: math.NaN()},
		{Header: h, MicroBatches: uint32(c.spec.MicroBatches), Lr: 0.1, Mass: -1},
		{Header: h, MicroBatches: uint32(c.spec.MicroBatches), Lr: 0.1, Mass: math.Inf(1)},
	} {
		r, err := tc.ctl.Request(s.refs[0], bad, 5*time.Second)
		d, _ := r.(*StepDone)
		if err != nil || d == nil || !strings.Contains(d.GetError(), "want a finite number from 0 up") {
			t.Errorf("StepBegin mass %v: reply %v, %v; want an error", bad.Mass, r, err)
		}
	}
	if _, _, _, err := c.evaluate(t.Context(), s, 0, nil); err != nil {
		t.Fatalf("an evaluation after the bad requests: %v", err)
	}
}

// Under the binary cross-entropy the loss stage sends each chunk's outputs
// back with its credit, and the coordinator's AUC of them is one
// process's, bit for bit, at every evaluation.
func TestEvaluationRanksScores(t *testing.T) {
	const n = 240
	x, y := nn.New(n, 24), make([]int64, n*5)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(math.Sin(float64(i) * 0.7))
	}
	for i := range y {
		if nn.F32(x)[i/5*24+i%5] > 0 { // a label follows a feature
			y[i] = 1
		}
	}
	xe, err := tensorio.F32Entry("x", x)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "clicks.safetensors")
	if err := tensorio.SaveSafetensorsEntries(data, []tensorio.Entry{xe, tensorio.I64Entry("y", y, n, 5)}, nil); err != nil {
		t.Fatal(err)
	}
	spec := jobtest.SmallSpec()
	spec.ID, spec.Model, spec.Data, spec.Width, spec.SyntheticSamples = "job-eval-auc", "../onnx/testdata/towers.onnx", data, 0, 0
	spec.Loss, spec.Batch, spec.MicroBatches, spec.Steps, spec.Epochs, spec.EvalEvery = nn.LossBCE, 16, 2, 6, 0, 3
	spec.Optimizer, spec.LR = "adam", 0.01
	spec.Partition = cutAt(t, spec, "a", "b")
	local := jobtest.Local(t, spec)
	tc := newInmemCluster(t, 2, nil)
	res, _ := runJob(t, spec, tc.config(2), nil)
	if len(local.Evaluations) != 2 || local.TestAUC != local.Evaluations[1].AUC || local.TestAUC <= 0.5 || local.TestAUC > 1 {
		t.Fatalf("one process: AUC %v, evaluations %+v", local.TestAUC, local.Evaluations)
	}
	if !slices.Equal(res.Evaluations, local.Evaluations) || math.Float64bits(res.TestAUC) != math.Float64bits(local.TestAUC) || res.EvaluatedOn != "stages" {
		t.Fatalf("evaluations %+v (on the %s), one process %+v", res.Evaluations, res.EvaluatedOn, local.Evaluations)
	}
}
