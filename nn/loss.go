package nn

import (
	"fmt"
	"math"
)

// SoftmaxCE is the softmax cross-entropy loss on logits [N, ..., classes]:
// one label per row of the last axis (per sample, or per position).
type SoftmaxCE struct {
	s Slot
}

// Forward returns the sum over the micro-batch of the per-sample losses, the
// number of samples whose largest logit is the label, and the gradient of
// scale·(summed loss) with respect to the logits. With scale = 1/B for a
// mini-batch of B samples, the gradients of its micro-batches add up to the
// gradient of the mean loss. The gradient belongs to the loss and stays
// valid until its next call.
func (l *SoftmaxCE) Forward(logits *Tensor, labels []int32, scale float32) (loss float64, correct int, grad *Tensor) {
	k := lastDim(logits)
	n := len(F32(logits)) / k
	if len(labels) != n {
		panic(fmt.Sprintf("nn: %d labels for %d rows", len(labels), n))
	}
	z := F32(logits)
	grad = l.s.Buf(0, logits.Shape()...)
	g := F32(grad)
	for i := 0; i < n; i++ {
		zs, gs := z[i*k:(i+1)*k], g[i*k:(i+1)*k]
		y := int(labels[i])
		if y < 0 || y >= k {
			panic(fmt.Sprintf("nn: label %d out of range [0, %d)", y, k))
		}
		m, arg := zs[0], 0
		for j, v := range zs {
			if v > m {
				m, arg = v, j
			}
		}
		if arg == y {
			correct++
		}
		var sum float64
		for _, v := range zs {
			sum += math.Exp(float64(v - m))
		}
		lse := float64(m) + math.Log(sum)
		loss += lse - float64(zs[y])
		for j, v := range zs {
			gs[j] = float32(math.Exp(float64(v)-lse)) * scale
		}
		gs[y] -= scale
	}
	return loss, correct, grad
}

// Argmax counts the rows of logits (along the last axis) whose largest
// entry is the label.
func Argmax(logits *Tensor, labels []int32) (correct int) {
	k := lastDim(logits)
	n := len(F32(logits)) / k
	z := F32(logits)
	for i := 0; i < n; i++ {
		zs := z[i*k : (i+1)*k]
		m, arg := zs[0], 0
		for j, v := range zs {
			if v > m {
				m, arg = v, j
			}
		}
		if arg == int(labels[i]) {
			correct++
		}
	}
	return correct
}
