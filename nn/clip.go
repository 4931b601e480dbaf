package nn

import "math"

// SumSquares is Σ g² over the gradient of p, in float64 and element order:
// the same bits wherever p's gradient has them.
func SumSquares(p *Param) float64 {
	var s float64
	for _, g := range F32(p.Grad) {
		s += float64(g) * float64(g)
	}
	return s
}

// ClipScale is the factor PyTorch's clip_grad_norm_ multiplies every
// gradient by: maxNorm/(norm + 1e-6), at most 1, for the norm over the
// whole model, √Σ sumsq (the parameters' SumSquares, a tied tensor once,
// summed in the order given).
func ClipScale(sumsq []float64, maxNorm float64) float32 {
	var total float64
	for _, s := range sumsq {
		total += s
	}
	return clipScale(total, maxNorm)
}

func clipScale(total, maxNorm float64) float32 {
	return float32(min(maxNorm/(math.Sqrt(total)+1e-6), 1))
}

// Normed is the trainable tensors of ps the gradients' norm runs over, in
// ps's order, each tied tensor once (the first of its copies, whose
// gradients SumTies made equal).
func Normed(ps []*Param) []*Param {
	var out []*Param
	for _, p := range Unique(ps) {
		if p.Trainable() {
			out = append(out, p)
		}
	}
	return out
}

// ScaleGrads multiplies the gradients of the trainable params by scale.
func ScaleGrads(ps []*Param, scale float32) {
	if scale == 1 {
		return
	}
	for _, p := range ps {
		if p.Trainable() {
			for i := range F32(p.Grad) {
				F32(p.Grad)[i] *= scale
			}
		}
	}
}

// ClipGrads scales the gradients of ps as clip_grad_norm_(ps, maxNorm)
// does, counting each tied tensor once.
func ClipGrads(ps []*Param, maxNorm float64) { ClipNormed(Normed(ps), ps, maxNorm) }

// ClipNormed is ClipGrads with the norm's tensors, Normed(ps), known: the
// squares summed in normed's order, as ClipScale sums them.
func ClipNormed(normed, ps []*Param, maxNorm float64) {
	var total float64
	for _, p := range normed {
		total += SumSquares(p)
	}
	ScaleGrads(ps, clipScale(total, maxNorm))
}
