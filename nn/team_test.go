package nn_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// panicky is a LeakyReLU that panics in Forward while fire is set.
type panicky struct {
	nn.LeakyReLU
	fire *bool
}

func (p panicky) Forward(c *nn.Ctx, s *nn.Slot, in []*nn.Tensor) *nn.Tensor {
	if *p.fire {
		panic("boom")
	}
	return p.LeakyReLU.Forward(c, s, in)
}

// convStage is conv → BatchNorm → panicky over 8×8×3 inputs: a stage whose
// passes run on the team thread on the fast path.
func convStage(t testing.TB, fire *bool) *nn.Graph {
	b := nn.NewBuilder()
	x := b.Input("x", 8, 8, 3)
	h := b.Add("conv", &nn.Conv2D{In: 3, Out: 8, K: 3, Pad: 1}, x)
	h = b.Add("bn", nn.NewBatchNorm(), h)
	h = b.Add("act", panicky{fire: fire}, h)
	g, err := b.Build(h)
	if err != nil {
		t.Fatal(err)
	}
	g.Init(3)
	return g
}

// A panic in a pass on the team thread reaches the goroutine that asked
// for the pass, and the team thread serves the next pass.
func TestTeamPassPanicReachesCaller(t *testing.T) {
	fire := true
	st := convStage(t, &fire).Whole()
	ctx := &nn.Ctx{Backend: newFast(t, 2), Train: true}
	in := []*nn.Tensor{randomTensor(1, 4, 8, 8, 3)}
	got := func() (p any) {
		defer func() { p = recover() }()
		st.Forward(ctx, 0, in)
		return nil
	}()
	if got != "boom" {
		t.Fatalf("recovered %v, want the layer's panic", got)
	}
	fire = false
	out := st.Forward(ctx, 0, in)
	if n := len(nn.F32(out[0])); n != 4*8*8*8 {
		t.Fatalf("output of %d values after the panic, want %d", n, 4*8*8*8)
	}
	st.Backward(ctx, 0, []*nn.Tensor{out[0]})
}

// Stages of several goroutines share the team thread and get what each
// gets alone.
func TestTeamSharedByStages(t *testing.T) {
	const stages, passes = 4, 5
	fire := false
	ctx := &nn.Ctx{Backend: newFast(t, 2), Train: true}
	sts := make([]*nn.Stage, stages)
	ins := make([][]*nn.Tensor, stages)
	alone := make([][]float32, stages)
	for i := range sts {
		sts[i] = convStage(t, &fire).Whole()
		ins[i] = []*nn.Tensor{randomTensor(uint64(i), 2+i, 8, 8, 3)}
		alone[i] = clone(nn.F32(sts[i].Forward(ctx, 0, ins[i])[0]))
	}
	var wg sync.WaitGroup
	errs := make([]error, stages)
	for i := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := *ctx
			for p := 0; p < passes; p++ {
				out := nn.F32(sts[i].Forward(&c, 0, ins[i])[0])
				for j := range out {
					if d := out[j] - alone[i][j]; d > 1e-5 || d < -1e-5 {
						errs[i] = fmt.Errorf("stage %d pass %d: value %d is %g, alone %g", i, p, j, out[j], alone[i][j])
						return
					}
				}
				sts[i].Backward(&c, 0, []*nn.Tensor{sts[i].Forward(&c, 0, ins[i])[0]})
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func randomTensor(seed uint64, shape ...int) *nn.Tensor {
	x := nn.New(shape...)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(r.NormFloat64())
	}
	return x
}
