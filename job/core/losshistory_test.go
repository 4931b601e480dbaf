package core

import (
	"slices"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/job"
)

// The core keeps the loss of every step in its status and its result, and
// steps replayed after a recovery replace the ones they repeat.
func TestCoreLossHistory(t *testing.T) {
	arg := func(k string, v ...string) datadriven.CmdArg { return datadriven.CmdArg{Key: k, Vals: v} }
	s := newSim(t, &datadriven.TestData{Cmd: "job", CmdArgs: []datadriven.CmdArg{
		arg("nodes", "a:1,b:1"), arg("steps", "40"), arg("checkpoint", "10")}})
	if s.core == nil {
		t.Fatalf("the job was refused: %s", s.flush())
	}
	do := func(cmd string, args ...datadriven.CmdArg) {
		s.command(t, &datadriven.TestData{Cmd: cmd, CmdArgs: args})
	}
	do("run", arg("to", "15"))
	if h := s.core.Status().LossHistory; len(h) != 15 || h[0] != (job.LossPoint{Step: 1, Loss: 1}) || h[14].Step != 15 {
		t.Fatalf("after 15 steps: history %v", h)
	}
	do("loss", arg("2"), arg("at", "30")) // the 31st step on
	do("kill", arg("b"), arg("at", "25"))
	do("run")
	st := s.core.Status()
	if st.State != job.StateDone || len(st.Recoveries) != 1 || st.Result == nil {
		t.Fatalf("the job: %s, %d recoveries", st.State, len(st.Recoveries))
	}
	var want []job.LossPoint
	for step := 1; step <= 40; step++ {
		want = append(want, job.LossPoint{Step: step, Loss: 1 + float64(step/31)})
	}
	if !slices.Equal(st.LossHistory, want) || !slices.Equal(st.Result.LossHistory, want) {
		t.Errorf("history\n%v\nresult's\n%v\nwant\n%v", st.LossHistory, st.Result.LossHistory, want)
	}
}
