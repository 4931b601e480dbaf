package nn

import (
	"fmt"
	"sync"
)

// LSTM is PyTorch's nn.LSTM(In, Hidden, batch_first=True) of one layer and
// one direction, the ONNX LSTM operator that PyTorch exports: per-sample
// input [T, In], output [T, Hidden], the hidden state after every step, from
// zero initial hidden and cell states. With the gates in PyTorch's order
// i, f, g, o (blocks of Hidden rows of the weights),
//
//	i, f, o = σ(W_i·x + b_i + R_i·h + r_i), …
//	g = tanh(W_g·x + b_g + R_g·h + r_g)
//	c' = f⊙c + i⊙g, h' = o⊙tanh(c')
//
// The parameters are PyTorch's state_dict tensors: weight_ih [4H, In],
// weight_hh [4H, H], bias_ih [4H], bias_hh [4H], initialised as PyTorch's
// U(±1/√H).
type LSTM struct {
	In, Hidden         int
	WIH, WHH, BIH, BHH *Param
}

// GRU is PyTorch's nn.GRU(In, Hidden, batch_first=True) of one layer and one
// direction (ONNX GRU with linear_before_reset = 1): per-sample input
// [T, In], output [T, Hidden], from a zero initial state. With the gates in
// PyTorch's order r, z, n,
//
//	r = σ(W_r·x + b_r + R_r·h + r_r), z = σ(W_z·x + b_z + R_z·h + r_z)
//	n = tanh(W_n·x + b_n + r⊙(R_n·h + r_n))
//	h' = (1 − z)⊙n + z⊙h
//
// The parameters are PyTorch's state_dict tensors: weight_ih [3H, In],
// weight_hh [3H, H], bias_ih [3H], bias_hh [3H], initialised U(±1/√H).
type GRU struct {
	In, Hidden         int
	WIH, WHH, BIH, BHH *Param
}

// # Passes
//
// Forward computes the input projections of all steps with one GEMM,
// x [N·T, In] by W_ihᵀ onto rows holding the bias, then runs the steps:
// one GEMM of h_{t-1} [N, H] by W_hhᵀ, reading h_{t-1} where the output
// holds it (leading dimension T·H), and an elementwise pass over the N
// rows. The LSTM adds the recurrent product onto the input projection in
// place (both biases are in the rows); the GRU keeps it apart, in its own
// [N·T, 3H] buffer, since r multiplies its n block. The elementwise pass
// overwrites the pre-activations with the gates.
//
// Backward runs the steps backwards. Each overwrites the saved gates of its
// step with the gradients of their pre-activations (the GRU the recurrent
// product, too, whose n block differs) and computes the gradient of
// h_{t-1} with one GEMM by W_hh. At the end, one GEMM over all steps gives
// each weight gradient (the one of W_hh against h shifted by one step),
// products with a column of ones the bias gradients, and one GEMM the input
// gradient. So Backward consumes what Forward saved: each slot must
// alternate Forward and Backward, as a Stage does.
//
// Slot buffers: 0 the output, 1 the gates, 2 the GRU's recurrent products
// or the LSTM's cell states, 3 tanh of the cell states, 4 the LSTM's summed
// biases, 5 and 6 the running gradients of h and c, 7 h shifted by one step,
// 8 ones, 9 the input gradient.
//
// Every product is rounded before it is added, σ and tanh are computed in
// float64 and rounded as the Sigmoid and Tanh layers do, and the passes split
// only over samples, so the bits do not depend on the thread count.

func (l *LSTM) Kind() string { return "lstm" }
func (l *GRU) Kind() string  { return "gru" }

func (l *LSTM) Build(in [][]int) ([]int, error) {
	out, err := rnnBuild(in, l.In, l.Hidden)
	if err != nil {
		return nil, err
	}
	l.WIH, l.WHH, l.BIH, l.BHH = rnnParams(4, l.In, l.Hidden)
	return out, nil
}

func (l *GRU) Build(in [][]int) ([]int, error) {
	out, err := rnnBuild(in, l.In, l.Hidden)
	if err != nil {
		return nil, err
	}
	l.WIH, l.WHH, l.BIH, l.BHH = rnnParams(3, l.In, l.Hidden)
	return out, nil
}

// Params are in PyTorch's state_dict order.
func (l *LSTM) Params() []*Param { return []*Param{l.WIH, l.WHH, l.BIH, l.BHH} }
func (l *GRU) Params() []*Param  { return []*Param{l.WIH, l.WHH, l.BIH, l.BHH} }

func rnnBuild(in [][]int, inSize, hidden int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if inSize < 1 || hidden < 1 {
		return nil, fmt.Errorf("input size %d and hidden size %d must be positive", inSize, hidden)
	}
	if len(in[0]) != 2 || in[0][0] < 1 || in[0][1] != inSize {
		return nil, fmt.Errorf("input %v: want [T, %d] (steps, features)", in[0], inSize)
	}
	return []int{in[0][0], hidden}, nil
}

// rnnParams returns weight_ih, weight_hh, bias_ih and bias_hh of g gates,
// all U(±1/√hidden) as PyTorch initialises them.
func rnnParams(g, in, hidden int) (wih, whh, bih, bhh *Param) {
	p := func(name string, shape ...int) *Param {
		q := newParam(shape, InitUniform, hidden)
		q.Name = name
		return q
	}
	return p("weight_ih", g*hidden, in), p("weight_hh", g*hidden, hidden),
		p("bias_ih", g*hidden), p("bias_hh", g*hidden)
}

// rnnDims returns the batch and step counts of x, [N, T, in].
func rnnDims(x *Tensor, in int) (n, t int) {
	sh := x.Shape()
	if len(sh) != 3 || sh[2] != in {
		panic(fmt.Sprintf("nn: recurrent layer: input of shape %v, want [N, T, %d]", sh, in))
	}
	return sh[0], sh[1]
}

// fillRows sets each of the rows of m (of width len(row)) to row.
func fillRows(m, row []float32, rows int) {
	w := len(row)
	for r := 0; r < rows; r++ {
		copy(m[r*w:(r+1)*w], row)
	}
}

// rnnGrain is the fewest sample rows worth a thread for a step's pass of
// `per` values a row (the forward pass calls exp or tanh for each).
func rnnGrain(per int) int { return max(1, 1024/per) }

// rnnPass is a step's elementwise pass in progress. Passes are pooled with
// their row functions bound once, so that a pass allocates nothing.
type rnnPass struct {
	h, steps, t int // hidden size, steps, the current step
	// gates [N·T, G·H]; hp the GRU's recurrent products [N·T, 3H]; cs and
	// tcs the LSTM's cell states and their tanh [N·T, H]; y the output;
	// dy its gradient; dh, dc the running gradients [N, H].
	gates, hp, cs, tcs, y, dy, dh, dc []float32

	lstmF, lstmB, gruF, gruB func(lo, hi int)
}

var rnnPasses = sync.Pool{New: func() any {
	p := new(rnnPass)
	p.lstmF, p.lstmB, p.gruF, p.gruB = p.lstmForward, p.lstmBackward, p.gruForward, p.gruBackward
	return p
}}

func (p *rnnPass) release() {
	*p = rnnPass{lstmF: p.lstmF, lstmB: p.lstmB, gruF: p.gruF, gruB: p.gruB}
	rnnPasses.Put(p)
}

// projectInputs fills slot buffer 1 with every step's input projection
// plus both biases, x·W_ihᵀ + b_ih + b_hh ([N·T, G·H]), and returns it with
// the output buffer (0) and the batch and step counts.
func projectInputs(c *Ctx, s *Slot, x *Tensor, in, hidden int, wih, bih, bhh *Param) (y *Tensor, pre []float32, n, steps int) {
	n, steps = rnnDims(x, in)
	g, rows := len(F32(bih.Value)), n*steps
	y = s.Buf(0, n, steps, hidden)
	pre = F32(s.Buf(1, rows, g))
	bias := F32(s.Buf(4, g))
	bi, bh := F32(bih.Value), F32(bhh.Value)
	for j := range bias {
		bias[j] = bi[j] + bh[j]
	}
	fillRows(pre, bias, rows)
	c.Backend.Sgemm(false, true, rows, g, in, 1, F32(x), in, F32(wih.Value), in, 1, pre, g)
	return y, pre, n, steps
}

func (l *LSTM) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y, gates, n, steps := projectInputs(c, s, in[0], l.In, l.Hidden, l.WIH, l.BIH, l.BHH)
	h, g := l.Hidden, 4*l.Hidden
	rows := n * steps
	be := c.Backend
	p := rnnPasses.Get().(*rnnPass)
	p.h, p.steps = h, steps
	p.gates, p.cs, p.tcs, p.y = gates, F32(s.Buf(2, rows, h)), F32(s.Buf(3, rows, h)), F32(y)
	whh := F32(l.WHH.Value)
	grain := rnnGrain(5 * h)
	for t := 0; t < steps; t++ {
		if t > 0 {
			be.Sgemm(false, true, n, g, h, 1, p.y[(t-1)*h:], steps*h, whh, h, 1, gates[t*g:], steps*g)
		}
		p.t = t
		parallel(threadsOf(c), n, grain, p.lstmF)
	}
	p.release()
	return y
}

// lstmForward runs step p.t of samples [lo, hi).
func (p *rnnPass) lstmForward(lo, hi int) {
	h, t := p.h, p.t
	for b := lo; b < hi; b++ {
		r := b*p.steps + t
		gs := p.gates[r*4*h : (r+1)*4*h]
		gi, gf, gg, gOut := gs[:h], gs[h:2*h], gs[2*h:3*h], gs[3*h:4*h]
		cs, tcs, y := p.cs[r*h:(r+1)*h], p.tcs[r*h:(r+1)*h], p.y[r*h:(r+1)*h]
		var cp []float32
		if t > 0 {
			cp = p.cs[(r-1)*h : r*h]
		}
		sigmoidRange(gs[:2*h], gs[:2*h])
		tanhRange(gg, gg)
		sigmoidRange(gOut, gOut)
		for j := range cs {
			cv := float32(gi[j] * gg[j])
			if cp != nil {
				cv = float32(gf[j]*cp[j]) + cv
			}
			cs[j] = cv
		}
		tanhRange(cs, tcs)
		for j, tc := range tcs {
			y[j] = gOut[j] * tc
		}
	}
}

func (l *LSTM) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n, steps := rnnDims(x, l.In)
	h, g := l.Hidden, 4*l.Hidden
	rows := n * steps
	p := rnnPasses.Get().(*rnnPass)
	p.h, p.steps = h, steps
	p.gates, p.cs, p.tcs = F32(s.Buf(1, rows, g)), F32(s.Buf(2, rows, h)), F32(s.Buf(3, rows, h))
	p.y, p.dy = F32(s.Buf(0, n, steps, h)), F32(dout)
	p.dh, p.dc = F32(s.Buf(5, n, h)), F32(s.Buf(6, n, h))
	whh := F32(l.WHH.Value)
	be := c.Backend
	grain := rnnGrain(16 * h)
	for t := steps - 1; t >= 0; t-- {
		p.t = t
		parallel(threadsOf(c), n, grain, p.lstmB)
		if t > 0 {
			// dh_{t-1} = dG_t·W_hh.
			be.Sgemm(false, false, n, h, g, 1, p.gates[t*g:], steps*g, whh, h, 0, p.dh, h)
		}
	}
	dg := p.gates
	p.release()
	return rnnParamGrads(c, s, l.In, h, n, steps, x, dg, dg, F32(out), l.WIH, l.WHH, l.BIH, l.BHH, need)
}

// lstmBackward runs step p.t of samples [lo, hi) backwards: it replaces the
// gates with the gradients of their pre-activations and carries dc (dh
// holds dG_{t+1}·W_hh, dc the gradient of c_t from step t+1, for t below
// the last step).
func (p *rnnPass) lstmBackward(lo, hi int) {
	h, t := p.h, p.t
	last := t == p.steps-1
	for b := lo; b < hi; b++ {
		r := b*p.steps + t
		gs := p.gates[r*4*h : (r+1)*4*h]
		gi, gf, gg, gOut := gs[:h], gs[h:2*h], gs[2*h:3*h], gs[3*h:4*h]
		tcs, dy := p.tcs[r*h:(r+1)*h], p.dy[r*h:(r+1)*h]
		dh, dc := p.dh[b*h:(b+1)*h], p.dc[b*h:(b+1)*h]
		var cp []float32
		if t > 0 {
			cp = p.cs[(r-1)*h : r*h]
		}
		for j := range tcs {
			i, f, gv, o, tc := gi[j], gf[j], gg[j], gOut[j], tcs[j]
			d := dy[j]
			if !last {
				d += dh[j]
			}
			dcv := float32(float32(d*o) * (1 - float32(tc*tc)))
			if !last {
				dcv += dc[j]
			}
			var df float32
			if cp != nil {
				df = float32(dcv*cp[j]) * float32(f*(1-f))
			}
			gi[j] = float32(dcv*gv) * float32(i*(1-i))
			gf[j] = df
			gg[j] = float32(dcv*i) * (1 - float32(gv*gv))
			gOut[j] = float32(d*tc) * float32(o*(1-o))
			dc[j] = float32(dcv * f)
		}
	}
}

func (l *GRU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n, steps := rnnDims(x, l.In)
	h, g := l.Hidden, 3*l.Hidden
	rows := n * steps
	y := s.Buf(0, n, steps, h)
	gates := F32(s.Buf(1, rows, g))
	hp := F32(s.Buf(2, rows, g))
	fillRows(gates, F32(l.BIH.Value), rows)
	fillRows(hp, F32(l.BHH.Value), rows)
	be := c.Backend
	be.Sgemm(false, true, rows, g, l.In, 1, F32(x), l.In, F32(l.WIH.Value), l.In, 1, gates, g)
	p := rnnPasses.Get().(*rnnPass)
	p.h, p.steps = h, steps
	p.gates, p.hp, p.y = gates, hp, F32(y)
	whh := F32(l.WHH.Value)
	grain := rnnGrain(3 * h)
	for t := 0; t < steps; t++ {
		if t > 0 {
			be.Sgemm(false, true, n, g, h, 1, p.y[(t-1)*h:], steps*h, whh, h, 1, hp[t*g:], steps*g)
		}
		p.t = t
		parallel(threadsOf(c), n, grain, p.gruF)
	}
	p.release()
	return y
}

// gruForward runs step p.t of samples [lo, hi).
func (p *rnnPass) gruForward(lo, hi int) {
	h, t := p.h, p.t
	for b := lo; b < hi; b++ {
		r := b*p.steps + t
		gs, hs := p.gates[r*3*h:(r+1)*3*h], p.hp[r*3*h:(r+1)*3*h]
		gr, gz, gn := gs[:h], gs[h:2*h], gs[2*h:3*h]
		hn := hs[2*h : 3*h]
		y := p.y[r*h : (r+1)*h]
		var hprev []float32
		if t > 0 {
			hprev = p.y[(r-1)*h : r*h]
		}
		rz := gs[:2*h]
		for j, v := range hs[:2*h] {
			rz[j] += v
		}
		sigmoidRange(rz, rz)
		for j, rv := range gr {
			gn[j] += float32(rv * hn[j])
		}
		tanhRange(gn, gn)
		for j, zv := range gz {
			hv := float32((1 - zv) * gn[j])
			if hprev != nil {
				hv = hv + float32(zv*hprev[j])
			}
			y[j] = hv
		}
	}
}

func (l *GRU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n, steps := rnnDims(x, l.In)
	h, g := l.Hidden, 3*l.Hidden
	rows := n * steps
	p := rnnPasses.Get().(*rnnPass)
	p.h, p.steps = h, steps
	p.gates, p.hp = F32(s.Buf(1, rows, g)), F32(s.Buf(2, rows, g))
	p.y, p.dy = F32(s.Buf(0, n, steps, h)), F32(dout)
	p.dh = F32(s.Buf(5, n, h))
	whh := F32(l.WHH.Value)
	be := c.Backend
	grain := rnnGrain(12 * h)
	for t := steps - 1; t >= 0; t-- {
		p.t = t
		parallel(threadsOf(c), n, grain, p.gruB)
		if t > 0 {
			// dh_{t-1} = z⊙dh_t (left in dh) + dHP_t·W_hh.
			be.Sgemm(false, false, n, h, g, 1, p.hp[t*g:], steps*g, whh, h, 1, p.dh, h)
		}
	}
	dxp, dhp := p.gates, p.hp
	p.release()
	return rnnParamGrads(c, s, l.In, h, n, steps, x, dxp, dhp, F32(out), l.WIH, l.WHH, l.BIH, l.BHH, need)
}

// gruBackward runs step p.t of samples [lo, hi) backwards: it replaces the
// gates with the gradients of the input projection's pre-activations and
// the recurrent products with theirs, and leaves z⊙dh_t in dh (which holds
// the recurrent part of dh_t for t below the last step).
func (p *rnnPass) gruBackward(lo, hi int) {
	h, t := p.h, p.t
	last := t == p.steps-1
	for b := lo; b < hi; b++ {
		r := b*p.steps + t
		gs, hs := p.gates[r*3*h:(r+1)*3*h], p.hp[r*3*h:(r+1)*3*h]
		gr, gz, gn := gs[:h], gs[h:2*h], gs[2*h:3*h]
		hr, hz, hn := hs[:h], hs[h:2*h], hs[2*h:3*h]
		dy, dh := p.dy[r*h:(r+1)*h], p.dh[b*h:(b+1)*h]
		var hprev []float32
		if t > 0 {
			hprev = p.y[(r-1)*h : r*h]
		}
		for j := range dy {
			rv, zv, nv := gr[j], gz[j], gn[j]
			d := dy[j]
			if !last {
				d += dh[j]
			}
			var hv float32
			if hprev != nil {
				hv = hprev[j]
			}
			dan := float32(d*(1-zv)) * (1 - float32(nv*nv))
			daz := float32(d*(hv-nv)) * float32(zv*(1-zv))
			dar := float32(dan*hn[j]) * float32(rv*(1-rv))
			gr[j], gz[j], gn[j] = dar, daz, dan
			hr[j], hz[j], hn[j] = dar, daz, float32(dan*rv)
			dh[j] = float32(d * zv)
		}
	}
}

// rnnParamGrads adds the parameter gradients of a whole sequence, from the
// pre-activation gradients dxp (input side) and dhp (recurrent side), both
// [N·T, G·H], and returns the input gradient when need[0] is set.
func rnnParamGrads(c *Ctx, s *Slot, in, h, n, steps int, x *Tensor, dxp, dhp, y []float32, wih, whh, bih, bhh *Param, need []bool) []*Tensor {
	be := c.Backend
	rows := n * steps
	g := len(dxp) / rows
	if wih.Grad != nil {
		// dW_ih += dXPᵀ·x.
		be.Sgemm(true, false, g, in, rows, 1, dxp, g, F32(x), in, 1, F32(wih.Grad), in)
	}
	if whh.Grad != nil && steps > 1 {
		// dW_hh += dHPᵀ·h_{t-1}, h_{-1} = 0.
		hprev := F32(s.Buf(7, rows, h))
		for b := 0; b < n; b++ {
			r := b * steps
			clear(hprev[r*h : (r+1)*h])
			copy(hprev[(r+1)*h:(r+steps)*h], y[r*h:(r+steps-1)*h])
		}
		be.Sgemm(true, false, g, h, rows, 1, dhp, g, hprev, h, 1, F32(whh.Grad), h)
	}
	if bih.Grad != nil || bhh.Grad != nil {
		// Column sums as products with ones, each column summed in row
		// order: the chain adds b·1 = b.
		ones := F32(s.Buf(8, rows))
		for i := range ones {
			ones[i] = 1
		}
		if bih.Grad != nil {
			be.Sgemm(false, false, 1, g, rows, 1, ones, rows, dxp, g, 1, F32(bih.Grad), g)
		}
		if bhh.Grad != nil {
			be.Sgemm(false, false, 1, g, rows, 1, ones, rows, dhp, g, 1, F32(bhh.Grad), g)
		}
	}
	out := s.Grads(1)
	if need[0] {
		dx := s.Buf(9, x.Shape()...)
		be.Sgemm(false, false, rows, in, g, 1, dxp, g, F32(wih.Value), in, 0, F32(dx), in)
		out[0] = dx
	}
	return out
}

// RNN is PyTorch's nn.RNN(In, Hidden, batch_first=True) of one layer and one
// direction, the ONNX RNN operator: per-sample input [T, In], output
// [T, Hidden], from a zero initial state,
//
//	h' = tanh(W·x + b + R·h + r), or with ReLU max(0, ·).
//
// The parameters are PyTorch's weight_ih [H, In], weight_hh [H, H], bias_ih
// and bias_hh [H], initialised U(±1/√H). Its passes are the LSTM's with one
// gate: the pre-activations of all steps from one GEMM, a GEMM a step for
// the recurrence, the weight gradients from one GEMM over all steps.
type RNN struct {
	In, Hidden         int
	ReLU               bool
	WIH, WHH, BIH, BHH *Param
}

func (l *RNN) Kind() string { return "rnn" }

func (l *RNN) Build(in [][]int) ([]int, error) {
	out, err := rnnBuild(in, l.In, l.Hidden)
	if err != nil {
		return nil, err
	}
	l.WIH, l.WHH, l.BIH, l.BHH = rnnParams(1, l.In, l.Hidden)
	return out, nil
}

func (l *RNN) Params() []*Param { return []*Param{l.WIH, l.WHH, l.BIH, l.BHH} }

func (l *RNN) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y, pre, n, steps := projectInputs(c, s, in[0], l.In, l.Hidden, l.WIH, l.BIH, l.BHH)
	h, be := l.Hidden, c.Backend
	yd, whh := F32(y), F32(l.WHH.Value)
	for t := 0; t < steps; t++ {
		if t > 0 {
			be.Sgemm(false, true, n, h, h, 1, yd[(t-1)*h:], steps*h, whh, h, 1, pre[t*h:], steps*h)
		}
		for b := 0; b < n; b++ {
			r := b*steps + t
			ps, ys := pre[r*h:(r+1)*h], yd[r*h:(r+1)*h]
			if l.ReLU {
				for j, v := range ps {
					ys[j] = max(v, 0)
				}
			} else {
				tanhRange(ps, ys)
			}
		}
	}
	return y
}

// Backward replaces the saved pre-activations step by step, last first,
// with their gradients: (dy + dh)·(1 − y²) for tanh, where y > 0 for ReLU.
func (l *RNN) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n, steps := rnnDims(x, l.In)
	h := l.Hidden
	rows := n * steps
	pre, yd, dy := F32(s.Buf(1, rows, h)), F32(out), F32(dout)
	dh, whh := F32(s.Buf(5, n, h)), F32(l.WHH.Value)
	be := c.Backend
	for t := steps - 1; t >= 0; t-- {
		for b := 0; b < n; b++ {
			r := b*steps + t
			g, ys, ds := pre[r*h:(r+1)*h], yd[r*h:(r+1)*h], dy[r*h:(r+1)*h]
			for j, v := range ys {
				d := ds[j]
				if t < steps-1 {
					d += dh[b*h+j]
				}
				switch {
				case !l.ReLU:
					g[j] = d * (1 - float32(v*v))
				case v > 0:
					g[j] = d
				default:
					g[j] = 0
				}
			}
		}
		if t > 0 {
			// dh_{t-1} = dPre_t·W_hh.
			be.Sgemm(false, false, n, h, h, 1, pre[t*h:], steps*h, whh, h, 0, dh, h)
		}
	}
	return rnnParamGrads(c, s, l.In, h, n, steps, x, pre, pre, yd, l.WIH, l.WHH, l.BIH, l.BHH, need)
}
