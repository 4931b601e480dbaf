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
// read by several layers, on token data written to dir: per-token labels
// (a language model) or one label a sample.
func tiedSpec(t *testing.T, model string, perToken bool, vocab int) job.Spec {
	t.Helper()
	const n, T = 48, 6
	ids := make([]int64, n*T)
	for i := range ids {
		ids[i] = int64((i*7 + i/T) % vocab)
	}
	y := tensorio.I64Entry("y", ids, n, T)
	if !perToken {
		labels := make([]int64, n)
		for i := range labels {
			labels[i] = ids[i*T] % 5
		}
		y = tensorio.I64Entry("y", labels, n)
	}
	data := filepath.Join(t.TempDir(), "tokens.safetensors")
	if err := tensorio.SaveSafetensorsEntries(data, []tensorio.Entry{tensorio.I64Entry("x", ids, n, T), y}, nil); err != nil {
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
// applied three times) train across stages as in one process, bit for
// bit, whatever the plan: the copies' gradients meet before the step,
// replicas and interleaved chunks included; the weights hash holds each
// tied tensor once.
func TestTiedWeightsAcrossStages(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	for _, c := range []struct {
		model    string
		perToken bool
		vocab    int
	}{{"tiedgpt", true, 5}, {"albert", false, 11}} {
		spec := tiedSpec(t, c.model, c.perToken, c.vocab)
		local := jobtest.Local(t, spec)
		j, err := jobtest.Check(t, spec).Prepare()
		if err != nil {
			t.Fatal(err)
		}
		if len(nn.Ties(j.Graph.Params())) == 0 {
			t.Fatalf("%s: no tied parameters", c.model)
		}
		for _, p := range []struct {
			partition, schedule string
			nodes               int
		}{
			{"uniform", "1f1b", 3},
			{cutAt(t, spec, "a", "b", "c"), "gpipe", 3},
			{cutAt(t, spec, "a,b", "c", "d"), "1f1b", 4},
			{cutAt(t, spec, "a", "b,c", "d"), "1f1b", 4},
			{cutAt(t, spec, "a", "b", "c,d"), "1f1b", 4},
			{cutAt(t, spec, "a", "b,c"), "gpipe", 3},
			{cutAt(t, spec, "a", "b", "c", "d"), "zb", 4},
			{cutAt(t, spec, "a", "b", "a", "b"), "interleaved", 2},
		} {
			if testing.Short() && p.nodes != 4 { // the race detector's run: replicas and zb
				continue
			}
			t.Run(c.model+"/"+p.schedule+"/"+p.partition, func(t *testing.T) {
				s := spec
				s.Partition, s.Schedule = p.partition, p.schedule
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
				if len(co.Plan().Stages) > 1 && ties == 0 {
					t.Fatalf("plan %s: no stage exchanges tied gradients", res.Plan)
				}
				if res.WeightsSHA256 != local.WeightsSHA256 {
					t.Fatalf("plan %s: weights %.16s, one process %.16s", res.Plan, res.WeightsSHA256, local.WeightsSHA256)
				}
				t.Logf("plan %s (%s): %d tie exchanges, weights equal", res.Plan, res.Schedule, ties)
			})
		}
	}
}
