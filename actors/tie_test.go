package actors

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// tiedSpec is a job of an ONNX model from onnx/testdata whose weights are
// read by several layers, on 48 samples written to a file: x of token ids
// with per-token labels (a language model, perToken) or one label a
// sample, or with vocab 0 two float inputs x0 and x1.
func tiedSpec(t *testing.T, model string, perToken bool, vocab int) job.Spec {
	t.Helper()
	const n, T = 48, 6
	ids := make([]int64, n*T)
	for i := range ids {
		ids[i] = int64((i*7 + i/T) % max(vocab, 5))
	}
	labels := make([]int64, n)
	for i := range labels {
		labels[i] = ids[i*T] % 5
	}
	es := []tensorio.Entry{tensorio.I64Entry("x", ids, n, T), tensorio.I64Entry("y", labels, n)}
	if perToken {
		es[1] = tensorio.I64Entry("y", ids, n, T)
	}
	if vocab == 0 {
		x0, x1 := nn.New(n, T), nn.New(n, T)
		for i := range nn.F32(x0) {
			nn.F32(x0)[i], nn.F32(x1)[i] = float32(ids[i])/4-0.5, float32(ids[(i*5)%len(ids)])/4-0.5
		}
		e0, err0 := tensorio.F32Entry("x0", x0)
		e1, err1 := tensorio.F32Entry("x1", x1)
		if err0 != nil || err1 != nil {
			t.Fatal(err0, err1)
		}
		es = []tensorio.Entry{e0, e1, es[1]}
	}
	data := filepath.Join(t.TempDir(), "data.safetensors")
	if err := tensorio.SaveSafetensorsEntries(data, es, nil); err != nil {
		t.Fatal(err)
	}
	s := jobtest.SmallSpec()
	s.ID = "job-" + model
	s.Model, s.Data, s.Width, s.SyntheticSamples = "../onnx/testdata/"+model+".onnx", data, 0, 0
	s.Batch, s.MicroBatches, s.Steps, s.Optimizer = 12, 4, 3, "adam"
	return s
}

// cutAt describes a partition of the model's layers: the runs of layers
// between the given fractions of them, each on the nodes named.
func cutAt(t *testing.T, spec job.Spec, runs ...string) string {
	t.Helper()
	j, err := jobtest.Check(t, spec).Prepare()
	if err != nil {
		t.Fatal(err)
	}
	nodes := j.Graph.Nodes
	var parts []string
	for k, on := range runs {
		lo, hi := k*len(nodes)/len(runs), (k+1)*len(nodes)/len(runs)-1
		parts = append(parts, fmt.Sprintf("%s-%s@%s", nodes[lo].Name, nodes[hi].Name, on))
	}
	return strings.Join(parts, "; ")
}

// Tied weights (a GPT's head tied to its token embedding, one block
// applied three times, one encoder for two inputs on parallel branches)
// train across stages as in one process, bit for
// bit, whatever the plan: the copies' gradients meet before the step,
// replicas, interleaved chunks and recomputation included; the weights
// hash holds each tied tensor once.
func TestTiedWeightsAcrossStages(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	for _, c := range []struct {
		model    string
		perToken bool
		vocab    int
	}{{"tiedgpt", true, 5}, {"albert", false, 11}, {"siamese", false, 0}} {
		spec := tiedSpec(t, c.model, c.perToken, c.vocab)
		local := jobtest.Local(t, spec)
		j, err := jobtest.Check(t, spec).Prepare()
		if err != nil {
			t.Fatal(err)
		}
		if len(nn.Ties(j.Graph.Params())) == 0 {
			t.Fatalf("%s: no tied parameters", c.model)
		}
		type plan struct {
			partition, schedule string
			nodes               int
			recompute           string
		}
		cases := []plan{
			{"uniform", "1f1b", 3, "all"},
			{cutAt(t, spec, "a", "b", "c"), "gpipe", 3, ""},
			{cutAt(t, spec, "a,b", "c", "d"), "1f1b", 4, ""},
			{cutAt(t, spec, "a", "b,c", "d"), "1f1b", 4, ""},
			{cutAt(t, spec, "a", "b", "c,d"), "1f1b", 4, ""},
			{cutAt(t, spec, "a", "b,c"), "gpipe", 3, ""},
			{cutAt(t, spec, "a", "b", "c", "d"), "zb", 4, ""},
			{cutAt(t, spec, "a", "b", "a", "b"), "interleaved", 2, ""},
		}
		if c.model == "siamese" { // the encoder's two uses side by side, GraphPipe's DAG
			cases = cases[:0]
			for _, on := range []string{"a; b; c", "a,b; c; d", "a; b,c; d"} {
				nodes := strings.Split(on, "; ")
				cases = append(cases, plan{"enc.0-enc.2@" + nodes[0] + "; enc.0_1-enc.2_1@" + nodes[1] + "; Sub-head@" + nodes[2], "graph", strings.Count(on, ",") + 3, ""})
			}
		}
		short := false
		for _, p := range cases {
			if testing.Short() && (short || !strings.Contains(p.partition, ",")) { // the race detector's run: one plan with replicas
				continue
			}
			short = true
			t.Run(c.model+"/"+p.schedule+"/"+p.partition, func(t *testing.T) {
				s := spec
				s.Partition, s.Schedule, s.Recompute = p.partition, p.schedule, p.recompute
				s.ID = fmt.Sprintf("job-%s-%s-%d", c.model, p.schedule, p.nodes)
				res, co := tc.run(t, s, p.nodes)
				ties := 0
				for _, st := range co.Plan().Stages {
					for _, in := range st.Program {
						if in.Op == balance.OpSendTie || in.Op == balance.OpRecvTie {
							ties++
						}
					}
				}
				if len(co.Plan().Stages) > 1 && (ties == 0 || len(co.Status().Tied) == 0) {
					t.Fatalf("plan %s: %d tie instructions, status names %v tied", res.Plan, ties, co.Status().Tied)
				}
				if res.WeightsSHA256 != local.WeightsSHA256 {
					t.Fatalf("plan %s: weights %.16s, one process %.16s", res.Plan, res.WeightsSHA256, local.WeightsSHA256)
				}
				t.Logf("plan %s (%s): %d tie exchanges, weights equal", res.Plan, res.Schedule, ties)
			})
		}
	}
}

// A classifier that pools each sequence's last token (an index computed
// from the ids, x[torch.arange(N), i]) trains on two and three stages as
// in one process.
func TestPickedTokenAcrossStages(t *testing.T) {
	if testing.Short() {
		t.Skip("no concurrency of its own for the race detector")
	}
	tc := newInmemCluster(t, 3, nil)
	spec := tiedSpec(t, "lasttoken", false, 11)
	local := jobtest.Local(t, spec)
	for _, on := range [][]string{{"a", "b", "c"}, {"a", "b"}} {
		s := spec
		s.Partition, s.Schedule, s.ID = cutAt(t, spec, on...), "1f1b", fmt.Sprintf("job-lasttoken-%d", len(on))
		res, _ := tc.run(t, s, len(on))
		if res.WeightsSHA256 != local.WeightsSHA256 {
			t.Fatalf("plan %s: weights %.16s, one process %.16s", res.Plan, res.WeightsSHA256, local.WeightsSHA256)
		}
	}
}

// Gradients clipped by their norm over the whole model (each stage sends
// its parameters' sums of squares, the coordinator the scale) give one
// process's weights, bit for bit, replicas, tied copies, interleaved chunks
// and the zero-bubble schedule included.
func TestClippedGradientsAcrossStages(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	spec := tiedSpec(t, "tiedgpt", true, 5)
	unclipped := jobtest.Local(t, spec)
	spec.ClipGradNorm = 0.05
	local := jobtest.Local(t, spec)
	if local.WeightsSHA256 == unclipped.WeightsSHA256 {
		t.Fatal("clipping at 0.05 changed no weight")
	}
	for i, p := range []struct {
		partition, schedule string
		nodes               int
	}{
		{cutAt(t, spec, "a,b", "c", "d"), "1f1b", 4},
		{cutAt(t, spec, "a", "b", "c", "d"), "zb", 4},
		{cutAt(t, spec, "a", "b", "a", "b"), "interleaved", 2},
		{"uniform", "gpipe", 3},
	} {
		if testing.Short() && i > 0 {
			continue
		}
		t.Run(p.schedule+"/"+p.partition, func(t *testing.T) {
			s := spec
			s.Partition, s.Schedule, s.ID = p.partition, p.schedule, fmt.Sprintf("job-clip-%d", i)
			res, _ := tc.run(t, s, p.nodes)
			if res.WeightsSHA256 != local.WeightsSHA256 {
				t.Fatalf("plan %s: weights %.16s, one process %.16s", res.Plan, res.WeightsSHA256, local.WeightsSHA256)
			}
		})
	}
}

// Frozen layers (fine-tuning) train across stages as in one process: a
// first stage that holds only frozen layers runs no backward pass and
// steps nothing (zero-bubble), a frozen layer after trainable ones passes
// input gradients only, a replicated stage sums no gradient of them
// (1F1B), with clipping and weight decay.
func TestFrozenLayersAcrossStages(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	spec := smallSpec("mlp32")
	spec.Freeze = []string{"fc1.", "fc2.", "fc3.", "fc4.", "fc5.", "fc6.", "fc7.", "fc8.", "fc20.weight", "fc24."}
	spec.Optimizer, spec.WeightDecay, spec.ClipGradNorm = "adamw", 0.1, 0.5
	local := jobtest.Local(t, spec)
	unfrozen := spec
	unfrozen.Freeze = nil
	if jobtest.Local(t, unfrozen).WeightsSHA256 == local.WeightsSHA256 {
		t.Fatal("freezing changed no weight")
	}
	for i, p := range []struct {
		partition, schedule string
		nodes               int
	}{
		{cutAt(t, spec, "a", "b", "c", "d"), "zb", 4}, // a holds fc1-relu8: frozen
		{cutAt(t, spec, "a,b", "c", "d"), "1f1b", 4},
	} {
		if testing.Short() && i > 0 {
			continue
		}
		t.Run(p.schedule+"/"+p.partition, func(t *testing.T) {
			s := spec
			s.Partition, s.Schedule, s.ID = p.partition, p.schedule, fmt.Sprintf("job-frozen-%d", i)
			res, _ := tc.run(t, s, p.nodes)
			if res.WeightsSHA256 != local.WeightsSHA256 {
				t.Fatalf("plan %s: weights %.16s, one process %.16s", res.Plan, res.WeightsSHA256, local.WeightsSHA256)
			}
		})
	}
}
