package nn

import (
	"fmt"
)

// SoftmaxCE is the softmax cross-entropy loss on logits [N, ..., classes]:
// one label per row of the last axis (per sample, or per position). It must
// not be copied after its first Forward.
type SoftmaxCE struct {
	// Threads is the number of threads rows are spread over (0: one); the
	// result does not depend on it.
	Threads int

	s    Slot
	rows []float64 // per row: its loss
	hits []bool    // per row: its largest logit is the label

	// The pass in progress, for fn (made once: a closure per call would
	// allocate).
	z, g   []float32
	labels []int32
	k      int
	scale  float32
	fn     func(lo, hi int)
}

// Forward returns the sum over the micro-batch of the per-sample losses, the
// number of samples whose largest logit is the label, and the gradient of
// scale·(summed loss) with respect to the logits. With scale = 1/B for a
// mini-batch of B samples, the gradients of its micro-batches add up to the
// gradient of the mean loss. The gradient belongs to the loss and stays
// valid until its next call. Rows are summed in order.
func (l *SoftmaxCE) Forward(logits *Tensor, labels []int32, scale float32) (loss float64, correct int, grad *Tensor) {
	k := lastDim(logits)
	n := len(F32(logits)) / k
	if len(labels) != n {
		panic(fmt.Sprintf("nn: %d labels for %d rows", len(labels), n))
	}
	for _, y := range labels {
		if y < 0 || int(y) >= k {
			panic(fmt.Sprintf("nn: label %d out of range [0, %d)", y, k))
		}
	}
	z := F32(logits)
	grad = l.s.Buf(0, logits.Shape()...)
	g := F32(grad)
	if cap(l.rows) < n {
		l.rows, l.hits = make([]float64, n), make([]bool, n)
	}
	l.z, l.g, l.labels, l.k, l.scale = z, g, labels, k, scale
	if l.fn == nil {
		l.fn = l.lossRows
	}
	parallel(max(l.Threads, 1), n, max(1, mathGrain/k), l.fn)
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
		for j := range gs {
			gs[j] *= scale
		}
		gs[y] -= scale
	}
}
