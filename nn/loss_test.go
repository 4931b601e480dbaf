package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// Each loss's value against a float64 formula, its gradient against
// central differences of that formula, and the same bits whatever the
// threads.
func TestLosses(t *testing.T) {
	type formula func(z, y float64) float64
	sigmoid := func(z float64) float64 { return 1 / (1 + math.Exp(-z)) }
	normal := func(r *rand.Rand) float32 { return float32(r.NormFloat64()) }
	for _, tc := range []struct {
		name    string
		f       formula
		targets func(r *rand.Rand) float32
		hit     func(z, y float32) bool
		kinks   []float64         // of the error z − y, where central differences do not hold
		loss    func(int) nn.Loss // nil: NewLoss(name)
	}{
		{nn.LossMSE, func(z, y float64) float64 { return (z - y) * (z - y) }, normal, nil, nil, nil},
		{nn.LossL1, func(z, y float64) float64 { return math.Abs(z - y) }, normal, nil, []float64{0}, nil},
		{nn.LossHuber, func(z, y float64) float64 {
			if d := math.Abs(z - y); d >= 1 {
				return d - 0.5
			}
			return (z - y) * (z - y) / 2
		}, normal, nil, []float64{-1, 1}, nil},
		{nn.LossBCE, func(z, y float64) float64 { return -y*math.Log(sigmoid(z)) - (1-y)*math.Log(1-sigmoid(z)) },
			func(r *rand.Rand) float32 { return r.Float32() }, func(z, y float32) bool { return (z > 0) == (y > 0.5) }, nil, nil},
		{"bce, pos_weight 3", func(z, y float64) float64 { return -3*y*math.Log(sigmoid(z)) - (1-y)*math.Log(1-sigmoid(z)) },
			func(r *rand.Rand) float32 { return r.Float32() }, func(z, y float32) bool { return (z > 0) == (y > 0.5) }, nil,
			func(threads int) nn.Loss { return nn.NewBCE(threads, []float32{3}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			const n, d = 2500, 7 // three chunks of mathGrain
			z, y := nn.New(n, d), make([]float32, n*d)
			for i := range y {
				nn.F32(z)[i], y[i] = float32(2*r.NormFloat64()), tc.targets(r)
			}
			scale := float32(1 / float64(n*d))
			var bits []float32
			var sums []float64
			for _, threads := range []int{1, 2, 5} {
				var l nn.Loss
				var err error
				if tc.loss != nil {
					l = tc.loss(threads)
				} else if l, err = nn.NewLoss(tc.name, threads); err != nil {
					t.Fatal(err)
				}
				sum, correct, grad := l.Forward(z, y, scale)
				want, hits := 0.0, 0
				for i, v := range nn.F32(z) {
					want += tc.f(float64(v), float64(y[i]))
					if tc.hit != nil && tc.hit(v, y[i]) {
						hits++
					}
					const h = 1e-4
					if slices.ContainsFunc(tc.kinks, func(k float64) bool { return math.Abs(float64(v-y[i])-k) < 2*h }) {
						continue
					}
					num := (tc.f(float64(v)+h, float64(y[i])) - tc.f(float64(v)-h, float64(y[i]))) / (2 * h) * float64(scale)
					if got := float64(nn.F32(grad)[i]); math.Abs(got-num) > 1e-5*float64(scale)*max(1, math.Abs(num/float64(scale))) {
						t.Fatalf("threads %d: gradient %d is %v, central differences %v", threads, i, got, num)
					}
				}
				if math.Abs(sum-want) > 1e-6*math.Abs(want) || correct != hits {
					t.Fatalf("threads %d: loss %v, correct %d; want %v, %d", threads, sum, correct, want, hits)
				}
				if bits == nil {
					bits = append([]float32(nil), nn.F32(grad)...)
				}
				for i, g := range nn.F32(grad) {
					if g != bits[i] {
						t.Fatalf("threads %d: gradient %d is %v, with one thread %v", threads, i, g, bits[i])
					}
				}
				sums = append(sums, sum)
			}
			if sums[1] != sums[0] || sums[2] != sums[0] {
				t.Fatalf("sums %v differ with the threads", sums)
			}
		})
	}
}

// The binary cross-entropy neither overflows nor loses a saturated logit's
// loss.
func TestBCEExtremeLogits(t *testing.T) {
	l, _ := nn.NewLoss(nn.LossBCE, 1)
	z := nn.FromData([]float32{-200, 200, -200, 200, 0}, 5)
	sum, correct, grad := l.Forward(z, []float32{0, 1, 1, 0, 0.5}, 1)
	if want := 400 + math.Ln2; math.Abs(sum-want) > 1e-12 || correct != 3 {
		t.Fatalf("loss %v, correct %d; want %v, 3", sum, correct, want)
	}
	if g := nn.F32(grad); g[0] != 0 || g[1] != 0 || g[2] != -1 || g[3] != 1 || g[4] != 0 {
		t.Fatalf("gradient %v", g)
	}
	// A positive's term twice: the missed positive costs 400.
	sum, correct, grad = nn.NewBCE(1, []float32{2}).Forward(z, []float32{0, 1, 1, 0, 0.5}, 1)
	if want := 600 + 1.5*math.Ln2; math.Abs(sum-want) > 1e-12 || correct != 3 {
		t.Fatalf("pos_weight 2: loss %v, correct %d; want %v, 3", sum, correct, want)
	}
	if g := nn.F32(grad); g[0] != 0 || g[1] != 0 || g[2] != -2 || g[3] != 1 || g[4] != -0.25 {
		t.Fatalf("pos_weight 2: gradient %v", g)
	}
}

// Targets from a peer or a file are checked before a loss reads them.
func TestLossRefusesBadTargets(t *testing.T) {
	for _, tc := range []struct {
		loss string
		out  []int
		y    []float32
		want string
	}{
		{nn.LossCE, []int{2, 3}, []float32{0}, "1 labels for logits [2 3]: want one for each row of the last axis (2)"},
		{nn.LossCE, []int{2, 3, 4}, []float32{0, 1, 2}, "or, classes on axis 1, each position (8)"},
		{nn.LossCE, []int{2, 3, 4}, []float32{0, 1, 2, 3, 0, 1, 2, 3}, "want a class in [0, 3)"},
		{nn.LossCE, []int{2, 3}, []float32{0, 3}, "want a class in [0, 3)"},
		{nn.LossCE, []int{2, 3}, []float32{0, 1.5}, "want a class in [0, 3)"},
		{nn.LossMSE, []int{2, 3}, []float32{0, 1, 2, 3, 4}, "5 targets for an output of shape [2 3]"},
		{nn.LossMSE, []int{1, 2}, []float32{0, float32(math.Inf(1))}, "target 1 is +Inf"},
		{nn.LossBCE, []int{1, 2}, []float32{0, 1.5}, "want a value in [0, 1]"},
		{nn.LossBCE, []int{1, 2}, []float32{float32(math.NaN()), 1}, "target 0 is NaN"},
	} {
		l, err := nn.NewLoss(tc.loss, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(tc.out, tc.y); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v %v: %v, want an error containing %q", tc.loss, tc.out, tc.y, err, tc.want)
		}
	}
	if _, err := nn.NewLoss("hinge", 1); err == nil {
		t.Error("an unknown loss was made")
	}
}

// Logits [N, classes, H, W] with a label for each of the N·H·W positions
// (a segmentation's, as PyTorch's CrossEntropyLoss takes them) give what
// the same logits moved to [N, H, W, classes] give.
func TestCrossEntropyClassesOnAxis1(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, k, h, w = 3, 4, 5, 2
	z, moved := nn.New(n, k, h, w), nn.New(n, h, w, k)
	y := make([]float32, n*h*w)
	for i := range y {
		y[i] = float32(r.IntN(k))
	}
	for s := range n {
		for c := range k {
			for p := range h * w {
				v := float32(r.NormFloat64())
				nn.F32(z)[(s*k+c)*h*w+p], nn.F32(moved)[(s*h*w+p)*k+c] = v, v
			}
		}
	}
	if a := nn.ClassAxis(z.Shape(), len(y)); a != 1 {
		t.Fatalf("class axis %d, want 1", a)
	}
	var axis1, last nn.SoftmaxCE
	l1, c1, g1 := axis1.Forward(z, y, 0.25)
	l2, c2, g2 := last.Forward(moved, y, 0.25)
	if l1 != l2 || c1 != c2 {
		t.Fatalf("loss %v, %d correct; classes last: %v, %d", l1, c1, l2, c2)
	}
	for s := range n {
		for c := range k {
			for p := range h * w {
				if a, b := nn.F32(g1)[(s*k+c)*h*w+p], nn.F32(g2)[(s*h*w+p)*k+c]; a != b {
					t.Fatalf("gradient of sample %d class %d position %d: %v, classes last %v", s, c, p, a, b)
				}
			}
		}
	}
}

// Labels nn.IgnoreLabel take no part: the loss and the gradient of the
// other rows are those of the logits without the ignored rows, the
// ignored rows' gradient is 0, and Count leaves them out.
func TestCrossEntropyIgnoresLabels(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, k = 40, 7
	z := nn.New(rows, k)
	y := make([]float32, rows)
	var kept []float32
	var keptY []float32
	for i := range rows {
		for j := range k {
			nn.F32(z)[i*k+j] = float32(r.NormFloat64())
		}
		y[i] = float32(r.IntN(k))
		if i%3 == 1 {
			y[i] = nn.IgnoreLabel
			continue
		}
		kept, keptY = append(kept, nn.F32(z)[i*k:(i+1)*k]...), append(keptY, y[i])
	}
	var all, some nn.SoftmaxCE
	if err := all.Check(z.Shape(), y); err != nil {
		t.Fatal(err)
	}
	if n := all.Count(y); n != len(keptY) {
		t.Fatalf("count %d, want %d", n, len(keptY))
	}
	l1, c1, g1 := all.Forward(z, y, 0.5)
	l2, c2, g2 := some.Forward(nn.FromData(kept, len(keptY), k), keptY, 0.5)
	if l1 != l2 || c1 != c2 {
		t.Fatalf("loss %v, %d correct; without the ignored rows %v, %d", l1, c1, l2, c2)
	}
	j := 0
	for i := range rows {
		for c := range k {
			got := nn.F32(g1)[i*k+c]
			if y[i] == nn.IgnoreLabel && got != 0 || y[i] != nn.IgnoreLabel && got != nn.F32(g2)[j*k+c] {
				t.Fatalf("gradient of row %d class %d: %v", i, c, got)
			}
		}
		if y[i] != nn.IgnoreLabel {
			j++
		}
	}
}

// Label smoothing ε: a row's loss is −Σ_j q_j log p_j for the target
// q = (1−ε)·onehot + ε/k, its gradient p − q; with ε = 0 the plain loss's
// bits.
func TestLabelSmoothing(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const rows, k = 30, 6
	z := nn.New(rows, k)
	y := make([]float32, rows)
	for i := range y {
		for j := range k {
			nn.F32(z)[i*k+j] = float32(2 * r.NormFloat64())
		}
		y[i] = float32(r.IntN(k))
	}
	y[4] = nn.IgnoreLabel
	const eps = 0.1
	smooth := nn.SoftmaxCE{Smoothing: eps}
	sum, _, grad := smooth.Forward(z, y, 1)
	want := 0.0
	for i := range rows {
		if y[i] == nn.IgnoreLabel {
			continue
		}
		zs := nn.F32(z)[i*k : (i+1)*k]
		lse := 0.0
		for _, v := range zs {
			lse += math.Exp(float64(v))
		}
		lse = math.Log(lse)
		for j, v := range zs {
			q := eps / k
			if j == int(y[i]) {
				q += 1 - eps
			}
			p := math.Exp(float64(v) - lse)
			want -= q * (float64(v) - lse)
			if g := float64(nn.F32(grad)[i*k+j]); math.Abs(g-(p-q)) > 1e-6 {
				t.Fatalf("row %d class %d: gradient %v, want %v", i, j, g, p-q)
			}
		}
	}
	if math.Abs(sum-want) > 1e-9*math.Abs(want) {
		t.Fatalf("loss %v, want %v", sum, want)
	}
	var plain, zero nn.SoftmaxCE
	zero.Smoothing = 0
	l1, _, g1 := plain.Forward(z, y, 0.5)
	l2, _, g2 := zero.Forward(z, y, 0.5)
	if l1 != l2 || !slices.Equal(nn.F32(g1), nn.F32(g2)) {
		t.Fatal("smoothing 0 changed the bits")
	}
}

// A step whose every label is ignored has loss 0 and no gradient, as the
// loss stages of a pipeline report it, not the NaN of 0/0.
func TestStepOfIgnoredLabelsOnly(t *testing.T) {
	g, err := zoo.Build("mlp32", zoo.Options{Width: 8, Input: []int{4}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	g.Init(1)
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	be, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	before := nn.WeightsSHA256(g.Params())
	tr := nn.NewTrainer(g, opt, be, 1)
	r := tr.Step(ignoredOnly{}, 0, 0, 0)
	if r.Loss != 0 || r.Samples != 0 || nn.WeightsSHA256(g.Params()) != before {
		t.Fatalf("loss %v over %d labels; weights changed: %v", r.Loss, r.Samples, nn.WeightsSHA256(g.Params()) != before)
	}
}

// ignoredOnly is two micro-batches of 2 samples whose labels are all ignored.
type ignoredOnly struct{}

func (ignoredOnly) BatchSize() int     { return 4 }
func (ignoredOnly) MicroBatches() int  { return 2 }
func (ignoredOnly) StepsPerEpoch() int { return 1 }
func (ignoredOnly) Fill(epoch, step, m int, b *nn.Batch) {
	b.X = []*nn.Tensor{nn.FromData([]float32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)}
	b.Y = []float32{nn.IgnoreLabel, nn.IgnoreLabel}
}

// Class weights scale each row's loss and gradient by its label's weight,
// and the mean divides by the counted labels' weights (CrossEntropyLoss's
// weight=); weights of 1 give the unweighted bits.
func TestSoftmaxCEClassWeights(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n, k = 300, 4
	w := []float32{0.5, 2, 1, 0.25}
	z, y := nn.New(n, k), make([]float32, n)
	for i := range nn.F32(z) {
		nn.F32(z)[i] = float32(2 * r.NormFloat64())
	}
	var mass float64
	for i := range y {
		y[i] = float32(r.IntN(k))
		if i%7 == 0 {
			y[i] = nn.IgnoreLabel
		} else {
			mass += float64(w[int(y[i])])
		}
	}
	scale := float32(1 / mass)
	for _, threads := range []int{1, 3} {
		l := &nn.SoftmaxCE{Threads: threads, Weights: w}
		if err := l.Check(z.Shape(), y); err != nil {
			t.Fatal(err)
		}
		if got := l.Mass(y); got != mass {
			t.Fatalf("mass %v, want %v", got, mass)
		}
		sum, _, grad := l.Forward(z, y, scale)
		var want float64
		for i := range n {
			if y[i] == nn.IgnoreLabel {
				continue
			}
			row := nn.F32(z)[i*k : (i+1)*k]
			lse := logSumExp(row)
			c, wc := int(y[i]), float64(w[int(y[i])])
			want += wc * (lse - float64(row[c]))
			for j, v := range row {
				g := math.Exp(float64(v) - lse)
				if j == c {
					g--
				}
				if got, want := float64(nn.F32(grad)[i*k+j]), g*wc*float64(scale); math.Abs(got-want) > 1e-6*float64(scale) {
					t.Fatalf("threads %d: gradient [%d, %d] is %v, want %v", threads, i, j, got, want)
				}
			}
		}
		if math.Abs(sum-want) > 1e-9*want {
			t.Fatalf("threads %d: loss %v, want %v", threads, sum, want)
		}
	}
	// With label smoothing ε, PyTorch weighs the smoothed terms too:
	// (1−ε)·w_y·nll + ε/k·Σ_c w_c·(−log p_c), the mean still over Σ w_y.
	const eps = 0.2
	ls := &nn.SoftmaxCE{Weights: w, Smoothing: eps}
	sum, _, grad := ls.Forward(z, y, scale)
	var want, wsum float64
	for _, v := range w {
		wsum += float64(v)
	}
	for i := range n {
		if y[i] == nn.IgnoreLabel {
			continue
		}
		row := nn.F32(z)[i*k : (i+1)*k]
		lse, c, wc := logSumExp(row), int(y[i]), float64(w[int(y[i])])
		want += (1 - eps) * wc * (lse - float64(row[c]))
		for j, v := range row {
			want += eps / k * float64(w[j]) * (lse - float64(v))
			g := math.Exp(float64(v)-lse)*((1-eps)*wc+eps/k*wsum) - eps/k*float64(w[j])
			if j == c {
				g -= (1 - eps) * wc
			}
			if got := float64(nn.F32(grad)[i*k+j]); math.Abs(got-g*float64(scale)) > 1e-6*float64(scale) {
				t.Fatalf("smoothed: gradient [%d, %d] is %v, want %v", i, j, got, g*float64(scale))
			}
		}
	}
	if math.Abs(sum-want) > 1e-9*want {
		t.Fatalf("smoothed: loss %v, want %v", sum, want)
	}
	ones := &nn.SoftmaxCE{Weights: []float32{1, 1, 1, 1}}
	plain := &nn.SoftmaxCE{}
	s1, c1, g1 := ones.Forward(z, y, 0.01)
	s0, c0, g0 := plain.Forward(z, y, 0.01)
	if s1 != s0 || c1 != c0 || !slices.Equal(nn.F32(g1), nn.F32(g0)) || ones.Mass(y) != float64(plain.Count(y)) {
		t.Fatalf("weights of 1: loss %v, %d right; unweighted %v, %d", s1, c1, s0, c0)
	}
	if err := (&nn.SoftmaxCE{Weights: w[:3]}).Check(z.Shape(), y); err == nil || !strings.Contains(err.Error(), "3 class weights for logits of 4 classes") {
		t.Fatalf("three weights for four classes: %v", err)
	}
}

// logSumExp is log Σ e^v over row, in float64.
func logSumExp(row []float32) float64 {
	var se float64
	for _, v := range row {
		se += math.Exp(float64(v))
	}
	return math.Log(se)
}
