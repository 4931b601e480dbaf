package nn_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// fastBackend is a deterministic backend that says it is not, so that the
// layers take the oneDNN path (in a build with it) while the GEMMs stay the
// reference ones.
type fastBackend struct{ nn.Backend }

func (fastBackend) Deterministic() bool { return false }

func newFast(t testing.TB, threads int) nn.Backend {
	be, err := nn.NewBackend("ppnode-det", threads, true)
	if err != nil {
		t.Fatal(err)
	}
	return fastBackend{be}
}

// sameWithin checks got against the reference want within tol of want's
// largest magnitude.
func sameWithin(t *testing.T, name string, tol float64, got, want []float32) {
	t.Helper()
	w := make([]float64, len(want))
	for i, v := range want {
		w[i] = float64(v)
	}
	closeTo(t, name, tol, got, w)
}

func clone(v []float32) []float32 { return append([]float32(nil), v...) }

// dnnlConvs are the geometries the oneDNN path is checked on: the zoo's
// and every general one (groups, depthwise, dilation, rectangular kernels,
// asymmetric pads and strides).
func dnnlConvs() []struct {
	name  string
	conv  func() *nn.Conv2D
	shape []int
} {
	cs := []struct {
		name  string
		conv  func() *nn.Conv2D
		shape []int
	}{
		{"3x3", func() *nn.Conv2D { return nn.NewConv2D(16, 24, 3, 1, 1) }, []int{9, 8, 16}},
		{"3x3-stride2", func() *nn.Conv2D { return nn.NewConv2D(16, 32, 3, 2, 1) }, []int{9, 10, 16}},
		{"3x3-rgb", func() *nn.Conv2D { return nn.NewConv2D(3, 16, 3, 1, 1) }, []int{8, 8, 3}},
		{"1x1", func() *nn.Conv2D { return nn.NewConv2D(64, 16, 1, 1, 0) }, []int{6, 5, 64}},
		{"1x1-stride2", func() *nn.Conv2D { return nn.NewConv2D(32, 64, 1, 2, 0) }, []int{7, 8, 32}},
		{"7x7-stride2-pad3", func() *nn.Conv2D { return nn.NewConv2D(3, 8, 7, 2, 3) }, []int{11, 10, 3}},
		{"5x5-odd-channels", func() *nn.Conv2D { return nn.NewConv2D(5, 7, 5, 1, 2) }, []int{6, 7, 5}},
		{"grouped-wide", func() *nn.Conv2D {
			return &nn.Conv2D{In: 32, Out: 48, K: 3, Pad: 1, Groups: 4, DH: 2, PadT: 2, PadB: 2, PadL: 1, PadR: 1}
		}, []int{12, 10, 32}},
		{"depthwise-wide", func() *nn.Conv2D { return &nn.Conv2D{In: 24, Out: 24, K: 3, Stride: 2, Pad: 1, Groups: 24} }, []int{11, 12, 24}},
	}
	return append(cs, generalConvs...)
}

// fastRuns are the ways the fast path runs a layer: split into one part per
// thread, or whole on the OpenMP team.
var fastRuns = []struct {
	threads int
	team    bool
}{{1, false}, {2, false}, {2, true}}

// The oneDNN path (a non-deterministic backend) gives the pure-Go path's
// results (the deterministic backend) within 1e-4 of each tensor's largest
// magnitude: output, input gradient, weight and bias gradients, the latter
// accumulated over two passes, on every geometry, batch size, thread
// count and way of running tried.
func TestDNNLConv2DMatchesPureGo(t *testing.T) {
	if !nn.OneDNN {
		t.Log("built without oneDNN: both paths are the pure-Go one")
	}
	ref, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range dnnlConvs() {
		for _, bias := range []bool{false, true} {
			for _, run := range fastRuns {
				threads := run.threads
				name := fmt.Sprintf("%s/bias=%v/threads=%d/team=%v", c.name, bias, threads, run.team)
				t.Run(name, func(t *testing.T) {
					seed := uint64(len(c.name))
					pure, fast := c.conv(), c.conv()
					pure.Bias, fast.Bias = bias, bias
					for _, n := range []int{5, 2} { // two batch sizes: two sets of primitives
						r := rand.New(rand.NewPCG(seed, uint64(n)))
						x, y, dy, dx, ps := runLayer(t, ref, pure, c.shape, n, r)
						in := []*nn.Tensor{x}
						// The same weights; two passes accumulate the gradients.
						if _, err := fast.Build([][]int{c.shape}); err != nil {
							t.Fatal(err)
						}
						for i, p := range fast.Params() {
							copy(nn.F32(p.Value), nn.F32(ps[i].Value))
							clear(nn.F32(p.Grad))
						}
						ctx := nn.WithTeam(&nn.Ctx{Backend: newFast(t, threads), Train: true}, run.team)
						var s nn.Slot
						for pass := 0; pass < 2; pass++ {
							gy := fast.Forward(ctx, &s, in)
							sameWithin(t, "y", 1e-4, nn.F32(gy), nn.F32(y))
							g := fast.Backward(ctx, &s, in, gy, dy, []bool{true})
							sameWithin(t, "dx", 1e-4, nn.F32(g[0]), nn.F32(dx))
						}
						for i, p := range fast.Params() {
							want := clone(nn.F32(ps[i].Grad))
							for j := range want {
								want[j] *= 2
							}
							sameWithin(t, "d"+p.Name, 1e-4, nn.F32(p.Grad), want)
						}
						// No input gradient wanted: none returned, the
						// parameter gradients still added.
						g := fast.Backward(ctx, &s, in, y, dy, []bool{false})
						if g[0] != nil {
							t.Errorf("input gradient returned though not wanted")
						}
						if nn.OneDNN {
							if impl := nn.ConvImpl(fast, n); impl[0] == "" {
								t.Errorf("batch %d: oneDNN made no primitives", n)
							} else if n == 5 && threads == 1 && !bias {
								t.Logf("oneDNN kernels: %q", impl)
							}
						}
					}
				})
			}
		}
	}
}

// A convolution's oneDNN primitives keep the weights in oneDNN's layout
// between passes: a change to the weights, even to one element, is seen by
// the next pass.
func TestDNNLConv2DSeesWeightUpdates(t *testing.T) {
	ref, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	shape := []int{6, 6, 16}
	pure, fast := nn.NewConv2D(16, 32, 3, 1, 1), nn.NewConv2D(16, 32, 3, 1, 1)
	r := rand.New(rand.NewPCG(1, 2))
	x, _, dy, _, ps := runLayer(t, ref, pure, shape, 4, r)
	if _, err := fast.Build([][]int{shape}); err != nil {
		t.Fatal(err)
	}
	copy(nn.F32(fast.W.Value), nn.F32(ps[0].Value))
	ctx, pctx := &nn.Ctx{Backend: newFast(t, 2), Train: true}, &nn.Ctx{Backend: ref, Train: true}
	var s, ps2 nn.Slot
	in := []*nn.Tensor{x}
	for step := 0; step < 4; step++ {
		// Change one weight (step 2 changes none), as an optimizer would
		// between steps.
		if step != 2 {
			i := (step * 997) % len(nn.F32(pure.W.Value))
			nn.F32(pure.W.Value)[i] += 0.5
			nn.F32(fast.W.Value)[i] += 0.5
		}
		want := pure.Forward(pctx, &ps2, in)
		wdx := pure.Backward(pctx, &ps2, in, want, dy, []bool{true})[0]
		got := fast.Forward(ctx, &s, in)
		sameWithin(t, fmt.Sprint("y after update ", step), 1e-4, nn.F32(got), nn.F32(want))
		gdx := fast.Backward(ctx, &s, in, got, dy, []bool{true})[0]
		sameWithin(t, fmt.Sprint("dx after update ", step), 1e-4, nn.F32(gdx), nn.F32(wdx))
	}
}

// Pooling through oneDNN gives the pure-Go results.
func TestDNNLPool2DMatchesPureGo(t *testing.T) {
	ref, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	pools := append(generalPools[:len(generalPools):len(generalPools)], struct {
		name  string
		g     poolGeom
		shape []int
	}{"vgg-2x2-wide", poolGeom{K: 2, Stride: 2}, []int{16, 16, 32}})
	for _, c := range pools {
		for _, kind := range []string{"max", "avg-include", "avg-exclude"} {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				mk := func() nn.Layer {
					switch kind {
					case "max":
						return c.g.max()
					case "avg-include":
						return c.g.avg(true)
					}
					return c.g.avg(false)
				}
				pure, fast := mk(), mk()
				if _, err := fast.Build([][]int{c.shape}); err != nil {
					t.Fatal(err)
				}
				for _, n := range []int{4, 3} {
					r := rand.New(rand.NewPCG(5, uint64(n)))
					x, y, dy, dx, _ := runLayer(t, ref, pure, c.shape, n, r)
					for _, team := range []bool{false, true} {
						ctx := nn.WithTeam(&nn.Ctx{Backend: newFast(t, 2), Train: true}, team)
						var s nn.Slot
						in := []*nn.Tensor{x}
						gy := fast.Forward(ctx, &s, in)
						sameWithin(t, "y", 1e-6, nn.F32(gy), nn.F32(y))
						g := fast.Backward(ctx, &s, in, gy, dy, []bool{true})
						sameWithin(t, "dx", 1e-6, nn.F32(g[0]), nn.F32(dx))
					}
				}
			})
		}
	}
}

// BatchNorm on the fast path, split or on the team, gives the pure-Go
// results in training (output, gradients, running statistics) and in
// evaluation.
func TestFastBatchNormMatchesPureGo(t *testing.T) {
	ref, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shape []int
		n     int
	}{
		{[]int{5, 4, 8}, 6}, {[]int{3, 3, 4}, 2}, {[]int{16, 16, 4}, 5}, {[]int{3, 3, 100}, 5}, {[]int{2, 2, 128}, 4}, {[]int{16, 16, 16}, 8}, {[]int{7}, 9}, {[]int{2, 2, 33}, 1}, {[]int{32, 32, 16}, 8},
	} {
		t.Run(fmt.Sprintf("%v/batch=%d", c.shape, c.n), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(c.n)))
			shape := append([]int{c.n}, c.shape...)
			x, dy := nn.New(shape...), nn.New(shape...)
			for i := range nn.F32(x) {
				nn.F32(x)[i] = float32(3 + 2*r.NormFloat64()) // a mean away from 0
				nn.F32(dy)[i] = float32(r.NormFloat64())
			}
			var outs [3][][]float32
			for k, be := range []nn.Backend{ref, newFast(t, 2), newFast(t, 2)} {
				team := k == 2
				l := nn.NewBatchNorm()
				if _, err := l.Build([][]int{c.shape}); err != nil {
					t.Fatal(err)
				}
				for j := range nn.F32(l.Weight.Value) {
					nn.F32(l.Weight.Value)[j] = float32(1 + 0.1*float64(j%5))
					nn.F32(l.Bias.Value)[j] = float32(0.1 * float64(j%3))
				}
				var s nn.Slot
				in := []*nn.Tensor{x}
				var res [][]float32
				for pass := 0; pass < 2; pass++ {
					ctx := nn.WithTeam(&nn.Ctx{Backend: be, Train: true}, team)
					y := l.Forward(ctx, &s, in)
					g := l.Backward(ctx, &s, in, y, dy, []bool{true})
					res = append(res, clone(nn.F32(y)), clone(nn.F32(g[0])))
				}
				res = append(res, nn.F32(l.Weight.Grad), nn.F32(l.Bias.Grad), nn.F32(l.RunMean.Value), nn.F32(l.RunVar.Value))
				ctx := nn.WithTeam(&nn.Ctx{Backend: be}, team)
				y := l.Forward(ctx, &s, []*nn.Tensor{x})
				g := l.Backward(ctx, &s, []*nn.Tensor{x}, y, dy, []bool{true})
				res = append(res, clone(nn.F32(y)), clone(nn.F32(g[0])))
				outs[k] = res
			}
			names := []string{"y", "dx", "y2", "dx2", "dweight", "dbias", "running_mean", "running_var", "eval y", "eval dx"}
			for i, name := range names {
				sameWithin(t, name, 1e-4, outs[1][i], outs[0][i])
				sameWithin(t, "team "+name, 1e-4, outs[2][i], outs[0][i])
			}
		})
	}
}

// A deterministic backend never takes the oneDNN path: training steps give
// the bits of the pure-Go layers whether or not oneDNN is compiled in (the
// hash is the one TestConv2DCommonPathBits and TestDeterministicTraining
// pin down on other tests; here the two builds are compared through
// the deterministic flag itself).
func TestDNNLNotUsedWhenDeterministic(t *testing.T) {
	run := func(be nn.Backend) string {
		tr := newTrainer(t, "resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}, Classes: 10}, be)
		b := reuse{randomBatches([]int{8, 8, 3}, 12, 3, 10)}
		for s := 0; s < 2; s++ {
			tr.Step(b, 0, 0, s)
		}
		return nn.WeightsSHA256(tr.Graph.Params())
	}
	det, err := nn.NewBackend("", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	a, b := run(det), run(det)
	if a != b {
		t.Fatalf("deterministic runs differ: %s, %s", a, b)
	}
	if nn.OneDNN {
		// The oneDNN path differs in the last bits: if it were taken in
		// deterministic mode, this would catch it.
		if c := run(newFast(t, 2)); c == a {
			t.Fatalf("the oneDNN path gave the deterministic bits exactly: it was not taken")
		}
	}
}

// One training step of a small resnet through oneDNN (uneven micro-batches,
// so two sets of primitives per layer) gives the pure-Go loss and
// gradients within 3e-4 of each tensor's largest magnitude: across 53
// float32 layers the rounding of two summation orders adds up to about
// 1.5e-4, as between PyTorch's float32 and float64 (TestTorchParity). Over
// several steps the two drift apart as any two summation orders do.
func TestDNNLTrainingStepMatchesPureGo(t *testing.T) {
	o := zoo.Options{Width: 1.0 / 16, Input: []int{16, 16, 3}, Classes: 5}
	var losses [2]float64
	var grads [2][][]float32
	var names []string
	for k, fast := range []bool{false, true} {
		be, err := nn.NewBackend("ppnode-det", 2, true)
		if err != nil {
			t.Fatal(err)
		}
		if fast {
			be = fastBackend{be}
		}
		tr := newTrainer(t, "resnet50", o, be)
		b := randomBatches(o.Input, 14, 3, 5)
		b.sizes = []int{5, 4, 5}
		losses[k] = stepNoUpdate(tr, b)
		for _, p := range tr.Graph.Params() {
			if p.Trainable() {
				grads[k] = append(grads[k], clone(nn.F32(p.Grad)))
				if fast {
					names = append(names, p.Name)
				}
			}
		}
	}
	sameWithin(t, "loss", 1e-5, []float32{float32(losses[1])}, []float32{float32(losses[0])})
	for i, name := range names {
		sameWithin(t, "grad "+name, 3e-4, grads[1][i], grads[0][i])
	}
}

// BenchmarkBatchNormPaths times a training pass (forward and backward) of
// BatchNorm on resnet50's activation shapes (width 0.25, 32×32 inputs,
// batch 32) on the pure-Go path and on the fast path.
func BenchmarkBatchNormPaths(b *testing.B) {
	for _, shape := range [][]int{{32, 32, 16}, {32, 32, 64}, {16, 16, 128}, {8, 8, 256}, {4, 4, 512}} {
		for _, path := range []string{"go", "fast"} {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", shape[0], shape[1], shape[2], path), func(b *testing.B) {
				be, err := nn.NewBackend("ppnode-det", 2, true)
				if err != nil {
					b.Fatal(err)
				}
				if path == "fast" {
					be = fastBackend{be}
				}
				l := nn.NewBatchNorm()
				if _, err := l.Build([][]int{shape}); err != nil {
					b.Fatal(err)
				}
				r := rand.New(rand.NewPCG(1, 2))
				x, dy := nn.New(append([]int{32}, shape...)...), nn.New(append([]int{32}, shape...)...)
				for i := range nn.F32(x) {
					nn.F32(x)[i] = float32(r.NormFloat64())
					nn.F32(dy)[i] = float32(r.NormFloat64())
				}
				ctx := &nn.Ctx{Backend: be, Train: true}
				var s nn.Slot
				in := []*nn.Tensor{x}
				need := []bool{true}
				b.SetBytes(int64(4 * len(nn.F32(x))))
				for b.Loop() {
					y := l.Forward(ctx, &s, in)
					l.Backward(ctx, &s, in, y, dy, need)
				}
			})
		}
	}
}

// A training pass (forward and backward of every micro-batch) of a small
// resnet and vgg on the fast path allocates nothing once the first pass
// has made the layers' primitives and buffers, except for vgg16's two
// Dropout layers, which make a generator (two objects) per pass. (The
// backend is the default one: the reference GEMM allocates.)
func TestDNNLTrainingPassAllocatesNothing(t *testing.T) {
	be, err := nn.NewBackend("", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if !nn.OneDNN || be.Deterministic() {
		t.Skip("no fast path in this build")
	}
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	o := zoo.Options{Width: 1.0 / 16, Input: []int{16, 16, 3}, Classes: 5}
	for model, want := range map[string]float64{"resnet50": 0, "vgg16": 2 * 2 * 2} {
		t.Run(model, func(t *testing.T) {
			tr := newTrainer(t, model, o, be)
			b := randomBatches(o.Input, 12, 2, 5)
			xs := make([]*nn.Tensor, 2)
			ys := make([][]float32, 2)
			for m := range xs {
				mb := nn.MicroBatch(b, 0, 0, m)
				xs[m], ys[m] = mb.X[0], mb.Y
			}
			var ce nn.SoftmaxCE
			in, dout := make([]*nn.Tensor, 1), make([]*nn.Tensor, 1)
			tr.Ctx.Train = true
			pass := func() {
				for m := range xs { // in slot 0, as Trainer.Step
					in[0] = xs[m]
					out := tr.Stage.Forward(&tr.Ctx, 0, in)
					_, _, dout[0] = ce.Forward(out[0], ys[m], 1.0/12)
					tr.Stage.Backward(&tr.Ctx, 0, dout)
				}
			}
			pass()
			allocs := testing.AllocsPerRun(3, pass)
			if allocs != want {
				t.Errorf("%v allocations per pass, want %v", allocs, want)
			}
		})
	}
}

// A stage folds each ReLU into the BatchNorm before it when nothing else
// reads the BatchNorm's output: in resnet50, the stem's and the first two
// of every bottleneck's (the third goes into the residual sum). A stage
// that ends at a BatchNorm gives its output as it is.
func TestStageFusesBatchNormReLU(t *testing.T) {
	g, err := zoo.Build("resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{16, 16, 3}, Classes: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nn.FusedReLUs(g.Whole()), 1+2*16; got != want {
		t.Errorf("whole resnet50 fuses %d ReLUs, want %d", got, want)
	}
	var names []string
	for _, n := range g.Nodes {
		names = append(names, n.Name)
		if _, ok := n.Layer.(*nn.BatchNorm); ok {
			break
		}
	}
	s, err := g.Stage(names)
	if err != nil {
		t.Fatal(err)
	}
	if got := nn.FusedReLUs(s); got != 0 {
		t.Errorf("a stage ending at a BatchNorm fuses %d ReLUs, want 0", got)
	}
}
