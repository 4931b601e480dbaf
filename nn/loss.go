package nn

import (
	"fmt"
	"math"
	"strings"
)

// Loss scores a micro-batch's output against its targets, sample after
// sample. Implementations must not be copied after their first Forward.
type Loss interface {
	// Check says why y cannot be the targets of an output of shape out
	// (nil when it can). Mass and Forward trust what Check accepts: a
	// caller checks targets from a peer, the data loader those of a file.
	Check(out []int, y []float32) error
	// Count is how many of the targets y count (the cross-entropy's
	// ignored labels do not): the accuracy divides by them.
	Count(y []float32) int
	// Mass is what the mean loss divides by: Count, or under class
	// weights the sum of the counted targets' weights (in float64, in
	// order).
	Mass(y []float32) float64
	// Forward returns the sum of the per-target losses, how many targets
	// were predicted right (0 for a loss without such a notion), and the
	// gradient of scale·sum with respect to out, which belongs to the loss
	// and stays valid until its next call. With scale 1/m, m the Mass of
	// a mini-batch's targets, the gradients of its micro-batches add up to
	// the gradient of its mean loss. The sum runs in order, whatever the
	// threads.
	Forward(out *Tensor, y []float32, scale float32) (loss float64, correct int, grad *Tensor)
}

// LossScores reports whether the loss of that name counts predictions
// right (the accuracy): the cross-entropies do, the errors do not.
func LossScores(name string) bool { return name == LossCE || name == LossBCE }

// LossNames lists the losses NewLoss knows.
func LossNames() []string { return []string{LossCE, LossMSE, LossL1, LossHuber, LossBCE} }

// The losses NewLoss knows, by the names a job spec gives them.
const (
	// LossCE is the softmax cross-entropy of logits [N, ..., classes]
	// against one class a row (PyTorch's CrossEntropyLoss).
	LossCE = "ce"
	// LossMSE is the squared error of each output value against a target
	// of the output's shape (MSELoss).
	LossMSE = "mse"
	// LossL1 is the absolute error (L1Loss).
	LossL1 = "l1"
	// LossHuber is the squared error's half within 1 of the target and the
	// absolute error less 1/2 beyond (HuberLoss with delta 1, which is
	// SmoothL1Loss with beta 1).
	LossHuber = "huber"
	// LossBCE is the binary cross-entropy of each output value taken as a
	// logit against a target in [0, 1] of the output's shape
	// (BCEWithLogitsLoss); a value is predicted right when its sign agrees
	// with its target's side of 1/2.
	LossBCE = "bce"
)

// NewLoss returns the loss of that name (LossCE, LossMSE, LossL1, LossHuber
// or LossBCE), spreading its work over threads (0: one); its results do
// not depend on them.
func NewLoss(name string, threads int) (Loss, error) {
	switch name {
	case LossCE:
		return &SoftmaxCE{Threads: threads}, nil
	case LossMSE:
		return &elementLoss{threads: threads, fn: mseElem}, nil
	case LossL1:
		return &elementLoss{threads: threads, fn: l1Elem}, nil
	case LossHuber:
		return &elementLoss{threads: threads, fn: huberElem}, nil
	case LossBCE:
		return NewBCE(threads, nil), nil
	}
	return nil, fmt.Errorf("nn: unknown loss %q (want %s)", name, strings.Join(LossNames(), ", "))
}

// NewBCE is the bce loss with each positive target's term weighted by
// posWeight (BCEWithLogitsLoss's pos_weight): one weight for every
// output, or one for each along the output's last axis (a label's, in
// multi-label classification). Above 1 a weight counts the positives of
// an imbalanced set (clicks, rare labels) more; nil or a single 1 is the
// plain bce.
func NewBCE(threads int, posWeight []float32) Loss {
	l := &elementLoss{threads: threads, fn: bceElem, unit: true, scored: true}
	if len(posWeight) > 1 || len(posWeight) == 1 && posWeight[0] != 1 {
		l.pw = posWeight
	}
	return l
}

// IgnoreLabel is a label the softmax cross-entropy skips (PyTorch's
// default ignore_index): no loss, no gradient, not counted, so that padding
// and prompt positions of a language model's sequences take no part.
const IgnoreLabel = -100

// SoftmaxCE is the softmax cross-entropy loss on logits [N, ..., classes]:
// one label per row of the last axis (per sample, or per position), a class
// number held exactly as a float32, or IgnoreLabel. Logits [N, classes, d1,
// ...] with a label for each of their N·d1·... positions, as PyTorch's
// CrossEntropyLoss takes a segmentation's, hold the classes on axis 1
// (ClassAxis). It must not be copied after its first Forward.
type SoftmaxCE struct {
	// Threads is the number of threads rows are spread over (0: one); the
	// result does not depend on it.
	Threads int
	// Smoothing ε in [0, 1) takes the target of a row as 1−ε on its label
	// plus ε spread evenly over the classes (PyTorch's label_smoothing).
	Smoothing float32
	// Weights, if set, weigh each row's loss by its label's weight, one
	// a class (PyTorch's weight=): the mean divides by the weights' sum
	// (Mass). With Smoothing, the smoothed terms are weighed by their
	// classes' weights, as PyTorch does.
	Weights []float32

	s    Slot
	rows []float64 // per row: its loss
	hits []bool    // per row: its largest logit is the label

	// The pass in progress, for fn (made once: a closure per call would
	// allocate).
	z, g   []float32
	labels []float32
	k      int
	scale  float32
	wsum   float64 // Σ Weights, for smoothWeightedRow
	fn     func(lo, hi int)
}

// ClassAxis is the axis of logits of shape out that holds the classes when
// labels labels go with them: the last when there is a label for each row
// of it, else 1 when there is one for each position of the other axes (the
// two differ unless both axes are as long). It returns -1 when neither fits.
func ClassAxis(out []int, labels int) int {
	switch {
	case len(out) > 0 && Size(out)/max(out[len(out)-1], 1) == labels:
		return len(out) - 1
	case len(out) > 2 && Size(out)/max(out[1], 1) == labels:
		return 1
	}
	return -1
}

// Check requires a class in [0, classes) for every row of the class axis.
func (l *SoftmaxCE) Check(out []int, y []float32) error {
	a := ClassAxis(out, len(y))
	if a < 0 {
		return fmt.Errorf("%d labels for logits %v: want one for each row of the last axis (%d) or, classes on axis 1, each position (%d)",
			len(y), out, Size(out)/max(out[len(out)-1], 1), Size(out)/max(out[min(1, len(out)-1)], 1))
	}
	k := out[a]
	if l.Weights != nil && len(l.Weights) != k {
		return fmt.Errorf("%d class weights for logits of %d classes", len(l.Weights), k)
	}
	for i, f := range y {
		if (f != float32(int32(f)) || f < 0 || int(f) >= k) && f != IgnoreLabel {
			return fmt.Errorf("label %d is %v, want a class in [0, %d) (or %d, ignored)", i, f, k, IgnoreLabel)
		}
	}
	return nil
}

// Count is the number of labels that are not IgnoreLabel.
func (l *SoftmaxCE) Count(y []float32) int {
	n := len(y)
	for _, f := range y {
		if f == IgnoreLabel {
			n--
		}
	}
	return n
}

// Mass is Count, or under Weights the sum of the counted labels' weights.
func (l *SoftmaxCE) Mass(y []float32) float64 {
	if l.Weights == nil {
		return float64(l.Count(y))
	}
	var m float64
	for _, f := range y {
		if f != IgnoreLabel {
			m += float64(l.Weights[int(f)])
		}
	}
	return m
}

// Forward returns the sum over the micro-batch of the per-row losses, the
// number of rows whose largest logit is the label, and the gradient of
// scale·(summed loss) with respect to the logits. Rows are summed in
// order.
func (l *SoftmaxCE) Forward(logits *Tensor, labels []float32, scale float32) (loss float64, correct int, grad *Tensor) {
	sh := logits.Shape()
	a := ClassAxis(sh, len(labels))
	if a < 0 {
		panic(fmt.Sprintf("nn: %d labels for logits %v", len(labels), sh))
	}
	k, n := sh[a], len(labels)
	z := F32(logits)
	grad = l.s.Buf(0, sh...)
	g := F32(grad)
	var inner int // positions per class of a sample, with the classes on axis 1
	if a != len(sh)-1 {
		// Rows of classes, [N, positions, classes], to and from the layout.
		inner = Size(sh[2:])
		zt, gt := F32(l.s.Buf(1, n, k)), F32(l.s.Buf(2, n, k))
		transposeClasses(z, zt, sh[0], k, inner, false)
		z, g = zt, gt
	}
	if cap(l.rows) < n {
		l.rows, l.hits = make([]float64, n), make([]bool, n)
	}
	l.z, l.g, l.labels, l.k, l.scale, l.wsum = z, g, labels, k, scale, 0
	for _, w := range l.Weights {
		l.wsum += float64(w)
	}
	if l.fn == nil {
		l.fn = l.lossRows
	}
	parallel(max(l.Threads, 1), n, max(1, mathGrain/k), l.fn)
	if inner > 0 {
		transposeClasses(F32(grad), g, sh[0], k, inner, true)
	}
	rows, hits := l.rows[:n], l.hits[:n]
	for i, r := range rows {
		loss += r
		if hits[i] {
			correct++
		}
	}
	return loss, correct, grad
}

// lossRows computes rows [lo, hi) of the pass in progress.
func (l *SoftmaxCE) lossRows(lo, hi int) {
	z, g, k, scale := l.z, l.g, l.k, l.scale
	for i := lo; i < hi; i++ {
		zs, gs := z[i*k:(i+1)*k], g[i*k:(i+1)*k]
		if l.labels[i] == IgnoreLabel {
			l.rows[i], l.hits[i] = 0, false
			clear(gs)
			continue
		}
		y := int(l.labels[i])
		m, arg := zs[0], 0
		for j, v := range zs {
			if v > m {
				m, arg = v, j
			}
		}
		// The first exponentials go to gs only to be summed.
		lse := float64(m) + logFast(expRow(zs, gs, float64(m)))
		l.rows[i], l.hits[i] = lse-float64(zs[y]), arg == y
		expRow(zs, gs, lse)
		if l.Smoothing != 0 && l.Weights != nil {
			l.rows[i] = l.smoothWeightedRow(zs, gs, y, lse, l.rows[i], scale)
			continue
		}
		if l.Smoothing != 0 {
			l.rows[i] = l.smoothRow(zs, gs, y, lse, l.rows[i], scale)
			continue
		}
		s := scale
		if l.Weights != nil {
			w := l.Weights[y]
			l.rows[i] *= float64(w)
			s = scale * w
		}
		for j := range gs {
			gs[j] *= s
		}
		gs[y] -= s
	}
}

// smoothRow returns a row's loss under label smoothing, (1−ε)·nll plus
// ε/k·Σ_j −log p_j, and turns gs, the row's probabilities, into the
// gradient scale·(p − q) of its target distribution q.
func (l *SoftmaxCE) smoothRow(zs, gs []float32, y int, lse, nll float64, scale float32) float64 {
	eps, k := float64(l.Smoothing), float64(len(zs))
	var sum float64 // Σ_j −log p_j = k·lse − Σ_j z_j
	for _, v := range zs {
		sum += float64(v)
	}
	spread := float32(eps / k)
	for j := range gs {
		gs[j] = (gs[j] - spread) * scale
	}
	// Products rounded before they are added: never fused (see doc.go).
	gs[y] -= float32(float32(1-eps) * scale)
	return float64((1-eps)*nll) + float64(eps/k*float64(float64(k*lse)-sum))
}

// smoothWeightedRow is smoothRow under class weights w, as PyTorch weighs
// both terms: (1−ε)·w_y·nll + ε/k·Σ_j w_j·(−log p_j), of gradient
// scale·(p_j·((1−ε)·w_y + ε/k·Σw) − (1−ε)·w_y·[j = y] − ε/k·w_j).
func (l *SoftmaxCE) smoothWeightedRow(zs, gs []float32, y int, lse, nll float64, scale float32) float64 {
	eps, k, w := float64(l.Smoothing), float64(len(zs)), l.Weights
	wy := float64(w[y])
	var sum float64 // Σ_j w_j·(−log p_j)
	for j, v := range zs {
		sum += float64(float64(w[j]) * (lse - float64(v)))
	}
	// Products rounded before they are added: never fused (see doc.go).
	a := float32(float64((1-eps)*wy) + float64(eps/k*l.wsum))
	for j := range gs {
		gs[j] = float32(float32(gs[j]*a)*scale) - float32(float32(eps/k*float64(w[j]))*scale)
	}
	gs[y] -= float32(float32((1-eps)*wy) * scale)
	return float64(float64((1-eps)*wy)*nll) + float64(eps/k*sum)
}

// transposeClasses copies [n, k, inner] values a into [n, inner, k] rows b,
// or, back, b's rows into a.
func transposeClasses(a, b []float32, n, k, inner int, back bool) {
	for s := range n {
		as, bs := a[s*k*inner:(s+1)*k*inner], b[s*k*inner:(s+1)*k*inner]
		for c := range k {
			for p := range inner {
				if back {
					as[c*inner+p] = bs[p*k+c]
				} else {
					bs[p*k+c] = as[c*inner+p]
				}
			}
		}
	}
}

// elementLoss is a loss of one output value against one target: the
// squared, absolute or Huber error, or the binary cross-entropy of a logit.
type elementLoss struct {
	threads int
	// fn returns the loss of output z against target y, its gradient with
	// respect to z, and whether z predicts y right.
	fn     func(z, y float32) (loss float64, grad float32, hit bool)
	unit   bool      // targets lie in [0, 1]
	scored bool      // hits count
	pw     []float32 // bce's positive weights, along the last axis (bceWeighted instead of fn)

	s     Slot
	vals  []float64
	hits  []bool
	z, g  []float32
	y     []float32
	scale float32
	run   func(lo, hi int)
}

func (l *elementLoss) Check(out []int, y []float32) error {
	if n := Size(out); len(y) != n {
		return fmt.Errorf("%d targets for an output of shape %v (%d values)", len(y), out, n)
	}
	if len(l.pw) > 1 && (len(out) == 0 || out[len(out)-1] != len(l.pw)) {
		return fmt.Errorf("%d positive weights for an output of shape %v: want one, or one a value of its last axis", len(l.pw), out)
	}
	for i, v := range y {
		switch {
		case math.IsNaN(float64(v)) || math.IsInf(float64(v), 0):
			return fmt.Errorf("target %d is %v", i, v)
		case l.unit && (v < 0 || v > 1):
			return fmt.Errorf("target %d is %v, want a value in [0, 1]", i, v)
		}
	}
	return nil
}

func (l *elementLoss) Count(y []float32) int { return len(y) }

func (l *elementLoss) Mass(y []float32) float64 { return float64(len(y)) }

func (l *elementLoss) Forward(out *Tensor, y []float32, scale float32) (loss float64, correct int, grad *Tensor) {
	n := len(y)
	if n != Size(out.Shape()) {
		panic(fmt.Sprintf("nn: %d targets for an output of shape %v", n, out.Shape()))
	}
	grad = l.s.Buf(0, out.Shape()...)
	if cap(l.vals) < n {
		l.vals, l.hits = make([]float64, n), make([]bool, n)
	}
	l.z, l.g, l.y, l.scale = F32(out), F32(grad), y, scale
	if l.run == nil {
		l.run = l.elements
	}
	parallel(max(l.threads, 1), n, mathGrain, l.run)
	for i, v := range l.vals[:n] {
		loss += v
		if l.scored && l.hits[i] {
			correct++
		}
	}
	return loss, correct, grad
}

func (l *elementLoss) elements(lo, hi int) {
	if l.pw != nil {
		for i := lo; i < hi; i++ {
			v, g, hit := bceWeighted(l.z[i], l.y[i], l.pw[i%len(l.pw)])
			l.vals[i], l.g[i], l.hits[i] = v, g*l.scale, hit
		}
		return
	}
	for i := lo; i < hi; i++ {
		v, g, hit := l.fn(l.z[i], l.y[i])
		l.vals[i], l.g[i], l.hits[i] = v, g*l.scale, hit
	}
}

// mseElem is (z − y)², of gradient 2(z − y).
func mseElem(z, y float32) (float64, float32, bool) {
	d := z - y
	return float64(d) * float64(d), 2 * d, false
}

// l1Elem is |z − y|, of gradient sign(z − y) (0 at 0, as PyTorch's).
func l1Elem(z, y float32) (float64, float32, bool) {
	d := z - y
	g := float32(0)
	switch {
	case d > 0:
		g = 1
	case d < 0:
		g = -1
	}
	return math.Abs(float64(d)), g, false
}

// huberElem is d²/2 for |d| < 1 and |d| − 1/2 beyond, d = z − y, of
// gradient d within and sign(d) beyond.
func huberElem(z, y float32) (float64, float32, bool) {
	d := z - y
	switch {
	case d >= 1:
		return float64(d) - 0.5, 1, false
	case d <= -1:
		return -float64(d) - 0.5, -1, false
	}
	return 0.5 * float64(d) * float64(d), d, false
}

// bceElem is −y·log σ(z) − (1 − y)·log(1 − σ(z)), computed without
// overflow as max(z, 0) − z·y + log(1 + e^−|z|), of gradient σ(z) − y.
func bceElem(z, y float32) (float64, float32, bool) {
	zf := float64(z)
	loss := max(zf, 0) - float64(zf*float64(y)) + logFast(1+expFast(-math.Abs(zf)))
	return loss, float32(sigmoidFast(zf)) - y, (z > 0) == (y > 0.5)
}

// bceWeighted is −p·y·log σ(z) − (1 − y)·log(1 − σ(z)), as PyTorch computes
// it: (1 − y)·z + w·(log(1 + e^−|z|) + max(−z, 0)) with w = 1 + (p − 1)·y,
// of gradient w·σ(z) − p·y. Each product is rounded before it is added, so
// that no machine fuses them.
func bceWeighted(z, y, p float32) (float64, float32, bool) {
	zf, yf, pf := float64(z), float64(y), float64(p)
	w := 1 + float64((pf-1)*yf)
	loss := float64((1-yf)*zf) + float64(w*(logFast(1+expFast(-math.Abs(zf)))+max(-zf, 0)))
	grad := float64(w*sigmoidFast(zf)) - float64(pf*yf)
	return loss, float32(grad), (z > 0) == (y > 0.5)
}
