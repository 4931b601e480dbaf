package core

import (
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/job"
)

// The status keeps the last LastSteps steps as the stages measured them,
// oldest first, in time order, one entry per stage of the plan; and each
// stage names the stages it feeds.
func TestLastSteps(t *testing.T) {
	cmd := func(name string, args ...datadriven.CmdArg) *datadriven.TestData {
		return &datadriven.TestData{Cmd: name, CmdArgs: args}
	}
	arg := func(k, v string) datadriven.CmdArg { return datadriven.CmdArg{Key: k, Vals: []string{v}} }
	s := newSim(t, cmd("job", arg("nodes", "a:1,b:1,c:1"), arg("model", "mlp32"), arg("partition", "uniform"), arg("steps", "40")))
	if st := s.core.Status(); len(st.LastSteps) != 0 {
		t.Fatalf("before any step: %d last steps", len(st.LastSteps))
	}
	s.command(t, cmd("run", arg("to", "3")))
	if n := len(s.core.Status().LastSteps); n != 3 {
		t.Fatalf("after 3 steps: %d last steps, want 3", n)
	}
	s.command(t, cmd("run", arg("to", "20")))
	st := s.core.Status()
	if len(st.LastSteps) != job.LastSteps {
		t.Fatalf("after 20 steps: %d last steps, want %d", len(st.LastSteps), job.LastSteps)
	}
	for i, ls := range st.LastSteps {
		if want := 20 - job.LastSteps + 1 + i; ls.Step != want {
			t.Errorf("last step %d is step %d, want %d", i, ls.Step, want)
		}
		if len(ls.Stages) != len(st.Stages) {
			t.Errorf("step %d: %d stage timings for %d stages", ls.Step, len(ls.Stages), len(st.Stages))
		}
		for k, sg := range ls.Stages {
			if sg.WallMS <= 0 || sg.ForwardMS <= 0 || sg.BackwardMS <= 0 {
				t.Errorf("step %d stage %d: %+v", ls.Step, k, sg)
			}
		}
		if ls.WallMS <= 0 {
			t.Errorf("step %d: wall %v ms", ls.Step, ls.WallMS)
		}
		// Steps do not overlap (a microsecond of rounding aside).
		if i > 0 {
			prev := st.LastSteps[i-1]
			if ls.AtMS < prev.AtMS+prev.WallMS-1e-3 {
				t.Errorf("step %d starts at %v ms, before step %d ends at %v ms", ls.Step, ls.AtMS, prev.Step, prev.AtMS+prev.WallMS)
			}
		}
	}
	// The newest step's passes, beside the simulated ones.
	if len(st.Passes) != len(st.Stages) {
		t.Errorf("passes of %d stages, want %d", len(st.Passes), len(st.Stages))
	}
	for k, ps := range st.Passes {
		if n := 2 * st.MicroBatches; len(ps) < n {
			t.Errorf("stage %d: %d passes, want at least %d", k, len(ps), n)
		}
	}
	if len(st.PredictedPasses) != len(st.Stages) {
		t.Errorf("predicted passes of %d stages, want %d", len(st.PredictedPasses), len(st.Stages))
	}
	for k, ps := range st.PredictedPasses {
		// mlp32's stages run a forward and a backward pass per micro-batch.
		if n := 2 * st.MicroBatches; len(ps) < n {
			t.Errorf("stage %d: %d predicted passes, want at least %d", k, len(ps), n)
		}
	}
	for k, sg := range st.Stages {
		switch {
		case k < len(st.Stages)-1 && (len(sg.To) != 1 || sg.To[0] != k+1):
			t.Errorf("stage %d sends to %v, want [%d]", k, sg.To, k+1)
		case k == len(st.Stages)-1 && len(sg.To) != 0:
			t.Errorf("the last stage sends to %v, want none", sg.To)
		}
	}
	// A status handed out does not change with later steps.
	before := st.LastSteps[0].Step
	s.command(t, cmd("run", arg("to", "25")))
	if st.LastSteps[0].Step != before {
		t.Errorf("a status handed out changed: its oldest step %d is now %d", before, st.LastSteps[0].Step)
	}
	if len(st.Passes) == 0 || len(st.Passes[0]) == 0 {
		t.Error("a status handed out lost its newest step's passes")
	}
}
