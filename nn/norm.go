package nn

import (
	"fmt"
	"math"
)

// BatchNorm normalises each channel (the last dimension) with the statistics
// of the micro-batch in training and the running statistics in evaluation.
// The running statistics are updated once per forward pass in training, so
// they depend on the order of micro-batches, which callers keep ascending.
type BatchNorm struct {
	C        int
	Momentum float64 // weight of the new statistics, 0.1 as in PyTorch
	Eps      float64

	Weight, Bias, RunMean, RunVar *Param

	sum, sum2 []float64 // scratch, one per channel
	parts     []float64 // scratch, chunks × 2 × C partial sums
	fast      bnFast    // the pass in progress on the fast path (see fastPath)
}

// bnChunks is the number of row chunks whose per-channel partial sums are
// added, in chunk order, into a channel's sum. It is fixed, not the thread
// count, so the sums are the same at every thread count.
const bnChunks = 8

// reduce sets out to the per-channel sums that fn accumulates over rows.
func (l *BatchNorm) reduce(c *Ctx, rows int, out []float64, fn func(part []float64, lo, hi int)) {
	l.reduce2(c, rows, out, nil, func(p1, _ []float64, lo, hi int) { fn(p1, lo, hi) })
}

// reduce2 is reduce for two sums at once (out2 may be nil).
func (l *BatchNorm) reduce2(c *Ctx, rows int, out1, out2 []float64, fn func(p1, p2 []float64, lo, hi int)) {
	C := l.C
	chunks := 1
	if rows >= 64*bnChunks {
		chunks = bnChunks
	}
	if len(l.parts) < chunks*2*C {
		l.parts = make([]float64, bnChunks*2*C)
	}
	parts := l.parts[:chunks*2*C]
	clear(parts)
	step := (rows + chunks - 1) / chunks
	parallel(threadsOf(c), chunks, 1, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			fn(parts[2*k*C:(2*k+1)*C], parts[(2*k+1)*C:(2*k+2)*C], k*step, min((k+1)*step, rows))
		}
	})
	clear(out1)
	if out2 != nil {
		clear(out2)
	}
	for k := 0; k < chunks; k++ {
		for j := 0; j < C; j++ {
			out1[j] += parts[2*k*C+j]
			if out2 != nil {
				out2[j] += parts[(2*k+1)*C+j]
			}
		}
	}
}

// NewBatchNorm returns a BatchNorm with PyTorch's defaults.
func NewBatchNorm() *BatchNorm { return &BatchNorm{Momentum: 0.1, Eps: 1e-5} }

func (l *BatchNorm) Kind() string { return "batchnorm" }

func (l *BatchNorm) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) < 1 {
		return nil, fmt.Errorf("takes one input, got %v", in)
	}
	l.C = in[0][len(in[0])-1]
	l.Weight = newParam([]int{l.C}, InitOne, 0)
	l.Weight.Name = "weight"
	l.Bias = newParam([]int{l.C}, InitZero, 0)
	l.Bias.Name = "bias"
	l.RunMean = newBuffer([]int{l.C}, InitZero)
	l.RunMean.Name = "running_mean"
	l.RunVar = newBuffer([]int{l.C}, InitOne)
	l.RunVar.Name = "running_var"
	l.sum, l.sum2 = make([]float64, l.C), make([]float64, l.C)
	return append([]int(nil), in[0]...), nil
}

func (l *BatchNorm) Params() []*Param { return []*Param{l.Weight, l.Bias, l.RunMean, l.RunVar} }

// Forward saves the channel means and inverse standard deviations used
// (buffers 1 and 2) for Backward.
func (l *BatchNorm) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := F32(in[0])
	C := l.C
	rows := len(x) / C
	y := s.Buf(0, in[0].Shape()...)
	mean, inv := F32(s.Buf(1, C)), F32(s.Buf(2, C))
	if fastPath(c) {
		l.forwardFast(c, x, F32(y), mean, inv, F32(s.Buf(3, C)), s.reluAfter)
		return y
	}
	if c.Train {
		sum, sum2 := l.sum, l.sum2
		nv := vector8(C)
		l.reduce(c, rows, sum, func(part []float64, lo, hi int) {
			if nv > 0 && hi > lo {
				bnSumAVX2(&x[lo*C], hi-lo, C, nv, &part[0])
			}
			p := part[nv:C]
			for r := lo; r < hi; r++ {
				xs := x[r*C+nv : (r+1)*C]
				for j, v := range xs {
					p[j] += float64(v)
				}
			}
		})
		for j := range sum {
			sum[j] /= float64(rows)
		}
		l.reduce(c, rows, sum2, func(part []float64, lo, hi int) {
			if nv > 0 && hi > lo {
				bnSqDevAVX2(&x[lo*C], hi-lo, C, nv, &sum[0], &part[0])
			}
			p, mu := part[nv:C], sum[nv:C]
			for r := lo; r < hi; r++ {
				xs := x[r*C+nv : (r+1)*C]
				for j, v := range xs {
					d := float64(v) - mu[j]
					p[j] += float64(d * d) // float64(): no fused multiply-add (arm64)
				}
			}
		})
		rm, rv := F32(l.RunMean.Value), F32(l.RunVar.Value)
		m := l.Momentum
		for j := range sum {
			v := sum2[j] / float64(rows)
			mean[j] = float32(sum[j])
			inv[j] = float32(1 / math.Sqrt(v+l.Eps))
			unbiased := v
			if rows > 1 {
				unbiased = sum2[j] / float64(rows-1)
			}
			if !c.Recompute {
				rm[j] = float32(float64((1-m)*float64(rm[j])) + float64(m*sum[j]))
				rv[j] = float32(float64((1-m)*float64(rv[j])) + float64(m*unbiased))
			}
		}
	} else {
		rm, rv := F32(l.RunMean.Value), F32(l.RunVar.Value)
		for j := range mean {
			mean[j] = rm[j]
			inv[j] = float32(1 / math.Sqrt(float64(rv[j])+l.Eps))
		}
	}
	// y = (x - mean) * (inv * weight) + bias. Folding the mean into the
	// bias would cancel catastrophically when |mean| >> std.
	scale := F32(s.Buf(3, C))
	w, b := F32(l.Weight.Value), F32(l.Bias.Value)
	for j := range scale {
		scale[j] = inv[j] * w[j]
	}
	// The ReLU after it, if the Stage fused one, applies as the values are
	// stored.
	yd, relu := F32(y), s.reluAfter
	nv := vector8(C)
	parallel(threadsOf(c), rows, 64, func(lo, hi int) {
		if nv > 0 && hi > lo {
			bnNormAVX2(&x[lo*C], &yd[lo*C], hi-lo, C, nv, &mean[0], &scale[0], &b[0], relu)
		}
		for r := lo; r < hi; r++ {
			xs, ys := x[r*C:(r+1)*C], yd[r*C:(r+1)*C]
			for j := nv; j < C; j++ {
				v := float32((xs[j]-mean[j])*scale[j]) + b[j]
				if relu {
					v = max(v, 0)
				}
				ys[j] = v
			}
		}
	})
	return y
}

func (l *BatchNorm) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x, dy := F32(in[0]), F32(dout)
	C := l.C
	rows := len(x) / C
	mean, inv := F32(s.Buf(1, C)), F32(s.Buf(2, C))
	if fastPath(c) {
		g := s.Grads(1)
		var dx []float32
		if need[0] {
			g[0] = s.Buf(5, in[0].Shape()...)
			dx = F32(g[0])
		}
		var y []float32 // the output, through a ReLU the layer applied
		if s.reluAfter {
			y = F32(out)
		}
		l.backwardFast(c, x, y, dy, dx, mean, inv, F32(s.Buf(3, C)), F32(s.Buf(4, C)), F32(s.Buf(6, C)))
		return g
	}
	// With a fused ReLU, dy passes through its gradient (out is the ReLU's
	// output) wherever it is read.
	var z []float32
	if s.reluAfter {
		z = F32(out)
	}
	sdy, sdyx := l.sum, l.sum2
	nv := vector8(C)
	l.reduce2(c, rows, sdy, sdyx, func(p1, p2 []float64, lo, hi int) {
		if nv > 0 && hi > lo {
			bnGradSumsAVX2(&x[lo*C], &dy[lo*C], hi-lo, C, nv, &mean[0], &inv[0], &p1[0], &p2[0], at(z, lo*C))
		}
		for r := lo; r < hi; r++ {
			xs, ds := x[r*C:(r+1)*C], dy[r*C:(r+1)*C]
			for j := nv; j < C; j++ {
				d := ds[j]
				if z != nil {
					d = reluGradOf(z[r*C+j], d)
				}
				xhat := float64((xs[j] - mean[j]) * inv[j])
				p1[j] += float64(d)
				p2[j] += float64(float64(d) * xhat)
			}
		}
	})
	gw, gb := F32(l.Weight.Grad), F32(l.Bias.Grad)
	for j := range gw {
		gw[j] += float32(sdyx[j])
		gb[j] += float32(sdy[j])
	}
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(5, in[0].Shape()...)
	d := F32(dx)
	w := F32(l.Weight.Value)
	// In training dx = w·inv/R · (R·dy − Σdy − x̂·Σdy·x̂); in evaluation the
	// statistics are constants and dx = w·inv·dy.
	k, a, bb := F32(s.Buf(3, C)), F32(s.Buf(4, C)), F32(s.Buf(6, C))
	R := float64(rows)
	for j := range k {
		k[j] = w[j] * inv[j]
		if c.Train {
			a[j] = float32(sdy[j] / R)
			bb[j] = float32(sdyx[j] / R)
		} else {
			a[j], bb[j] = 0, 0
		}
	}
	parallel(threadsOf(c), rows, 64, func(lo, hi int) {
		if nv > 0 && hi > lo {
			bnInputGradAVX2(&x[lo*C], &dy[lo*C], &d[lo*C], hi-lo, C, nv, &mean[0], &inv[0], &k[0], &a[0], &bb[0], at(z, lo*C))
		}
		for r := lo; r < hi; r++ {
			xs, ds, o := x[r*C:(r+1)*C], dy[r*C:(r+1)*C], d[r*C:(r+1)*C]
			for j := nv; j < C; j++ {
				dv := ds[j]
				if z != nil {
					dv = reluGradOf(z[r*C+j], dv)
				}
				xhat := (xs[j] - mean[j]) * inv[j]
				o[j] = k[j] * (dv - a[j] - float32(xhat*bb[j]))
			}
		}
	})
	g[0] = dx
	return g
}

// at is &s[i], or nil for a nil s.
func at(s []float32, i int) *float32 {
	if s == nil {
		return nil
	}
	return &s[i]
}
