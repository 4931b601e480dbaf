//go:build cgo && dnnl

package dnnl

/*
#cgo CFLAGS: -O3 -fopenmp
#cgo LDFLAGS: -ldnnl -lgomp
#include "ppn.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Available reports whether oneDNN is compiled in.
const Available = true

// mu serialises the creation of primitives: oneDNN's engine is made on the
// first one.
var mu sync.Mutex

const errLen = 256

func newError(what string, st C.int, msg []byte) error {
	n := 0
	for n < len(msg) && msg[n] != 0 {
		n++
	}
	return fmt.Errorf("dnnl: %s: %s (status %d)", what, msg[:n], int(st))
}

// ErrExec wraps the failure of a primitive's execution.
var ErrExec = errors.New("dnnl: execution failed")

// check turns an execution status into an error.
func check(what string, st C.int) error {
	if st != 0 {
		return fmt.Errorf("%w: %s: status %d", ErrExec, what, int(st))
	}
	return nil
}

// f32 returns the address of v's first element (nil for an empty v).
func f32(v []float32) *C.float { return (*C.float)(unsafe.Pointer(unsafe.SliceData(v))) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Conv is a convolution's forward, backward-data and backward-weights
// primitives for one geometry and batch size.
type Conv struct {
	c *C.ppn_conv
	g ConvGeom
}

// NewConv makes the primitives of g, or returns an error if oneDNN has no
// kernel for it.
func NewConv(g ConvGeom) (*Conv, error) {
	cg := C.ppn_conv_geom{
		n: C.int(g.N), ic: C.int(g.IC), ih: C.int(g.IH), iw: C.int(g.IW),
		oc: C.int(g.OC), oh: C.int(g.OH), ow: C.int(g.OW),
		kh: C.int(g.KH), kw: C.int(g.KW), sh: C.int(g.SH), sw: C.int(g.SW), dh: C.int(g.DH), dw: C.int(g.DW),
		pt: C.int(g.PadT), pl: C.int(g.PadL), pb: C.int(g.PadB), pr: C.int(g.PadR),
		groups: C.int(g.Groups), bias: cbool(g.Bias),
	}
	c := &Conv{g: g}
	msg := make([]byte, errLen)
	mu.Lock()
	st := C.ppn_conv_new(&cg, &c.c, (*C.char)(unsafe.Pointer(&msg[0])), C.int(len(msg)))
	mu.Unlock()
	if st != 0 {
		return nil, newError("convolution", st, msg)
	}
	runtime.AddCleanup(c, func(p *C.ppn_conv) { C.ppn_conv_free(p) }, c.c)
	return c, nil
}

// Impl names the kernels oneDNN chose: forward, backward data, backward
// weights.
func (c *Conv) Impl() [3]string {
	var s [3]string
	for i := range s {
		s[i] = C.GoString(C.ppn_conv_impl(c.c, C.int(i)))
	}
	return s
}

// sizes checks the lengths of an input, an output and weights (unless nil).
func (c *Conv) sizes(x, y, w []float32) {
	g := &c.g
	if len(x) != g.N*g.IH*g.IW*g.IC || len(y) != g.N*g.OH*g.OW*g.OC || w != nil && len(w) != g.OC*g.KH*g.KW*(g.IC/g.Groups) {
		panic(fmt.Sprintf("dnnl: convolution %+v given %d, %d, %d elements", *g, len(x), len(y), len(w)))
	}
}

// Forward computes y from x, weights w and bias b (nil without bias).
func (c *Conv) Forward(threads int, x, w, b, y []float32) error {
	c.sizes(x, y, w)
	c.bias(b)
	err := check("convolution forward", C.ppn_conv_forward(c.c, C.int(threads), f32(x), f32(w), f32(b), f32(y)))
	runtime.KeepAlive(c)
	return err
}

// BackwardData writes dx, the gradient of the input, from dy and w.
func (c *Conv) BackwardData(threads int, dy, w, dx []float32) error {
	c.sizes(dx, dy, w)
	err := check("convolution backward data", C.ppn_conv_backward_data(c.c, C.int(threads), f32(dy), f32(w), f32(dx)))
	runtime.KeepAlive(c)
	return err
}

// BackwardWeights computes the weight and bias gradients of x and dy into
// the primitive's own buffers, for AddGrads.
func (c *Conv) BackwardWeights(threads int, x, dy []float32) error {
	c.sizes(x, dy, nil)
	err := check("convolution backward weights", C.ppn_conv_backward_weights(c.c, C.int(threads), f32(x), f32(dy)))
	runtime.KeepAlive(c)
	return err
}

// AddGrads adds the gradients of the last BackwardWeights into dw and db
// (nil without bias). On an error dw may hold part of the sum.
func (c *Conv) AddGrads(threads int, dw, db []float32) error {
	g := &c.g
	if len(dw) != g.OC*g.KH*g.KW*(g.IC/g.Groups) {
		panic(fmt.Sprintf("dnnl: convolution %+v given a weight gradient of %d elements", *g, len(dw)))
	}
	c.bias(db)
	err := check("convolution gradient accumulation", C.ppn_conv_add_grads(c.c, C.int(threads), f32(dw), f32(db)))
	runtime.KeepAlive(c)
	return err
}

// bias checks the length of a bias or its gradient: OC elements, or none
// without bias.
func (c *Conv) bias(b []float32) {
	if want := c.g.OC * btoi(c.g.Bias); len(b) != want {
		panic(fmt.Sprintf("dnnl: convolution %+v given a bias of %d elements, want %d", c.g, len(b), want))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Pool is a pooling's forward and backward primitives for one geometry and
// batch size.
type Pool struct {
	p  *C.ppn_pool
	g  PoolGeom
	ws int
}

// NewPool makes the primitives of g.
func NewPool(g PoolGeom) (*Pool, error) {
	cg := C.ppn_pool_geom{
		n: C.int(g.N), c: C.int(g.C), ih: C.int(g.IH), iw: C.int(g.IW), oh: C.int(g.OH), ow: C.int(g.OW),
		kh: C.int(g.KH), kw: C.int(g.KW), sh: C.int(g.SH), sw: C.int(g.SW),
		pt: C.int(g.PadT), pl: C.int(g.PadL), pb: C.int(g.PadB), pr: C.int(g.PadR), alg: C.int(g.Alg),
	}
	p := &Pool{g: g}
	msg := make([]byte, errLen)
	mu.Lock()
	st := C.ppn_pool_new(&cg, &p.p, (*C.char)(unsafe.Pointer(&msg[0])), C.int(len(msg)))
	mu.Unlock()
	if st != 0 {
		return nil, newError("pooling", st, msg)
	}
	p.ws = int(C.ppn_pool_workspace(p.p)+3) / 4
	runtime.AddCleanup(p, func(c *C.ppn_pool) { C.ppn_pool_free(c) }, p.p)
	return p, nil
}

// Workspace is the number of int32s of the workspace that Forward writes
// and Backward reads (0 for average pooling).
func (p *Pool) Workspace() int { return p.ws }

// sizes checks the lengths of an input, an output and a workspace.
func (p *Pool) sizes(x, y []float32, ws []int32) unsafe.Pointer {
	g := &p.g
	if len(x) != g.N*g.IH*g.IW*g.C || len(y) != g.N*g.OH*g.OW*g.C || len(ws) < p.ws {
		panic(fmt.Sprintf("dnnl: pooling %+v given %d, %d elements and a workspace of %d, want %d", *g, len(x), len(y), len(ws), p.ws))
	}
	return unsafe.Pointer(unsafe.SliceData(ws))
}

// Forward computes y from x and writes the workspace.
func (p *Pool) Forward(threads int, x, y []float32, ws []int32) error {
	w := p.sizes(x, y, ws)
	err := check("pooling forward", C.ppn_pool_forward(p.p, C.int(threads), f32(x), f32(y), w))
	runtime.KeepAlive(p)
	return err
}

// Backward writes dx from dy and the workspace of the forward pass.
func (p *Pool) Backward(threads int, dy []float32, ws []int32, dx []float32) error {
	w := p.sizes(dx, dy, ws)
	err := check("pooling backward", C.ppn_pool_backward(p.p, C.int(threads), f32(dy), w, f32(dx)))
	runtime.KeepAlive(p)
	return err
}

// The batch normalisation kernels run over rows of c channels: x, y, dy
// and dx hold whole rows; the vectors hold c values.

func rowsOf(v []float32, c int) C.int {
	if c <= 0 || len(v)%c != 0 {
		panic(fmt.Sprintf("dnnl: %d values are not rows of %d channels", len(v), c))
	}
	return C.int(len(v) / c)
}

func f64(v []float64) *C.double { return (*C.double)(unsafe.Pointer(unsafe.SliceData(v))) }

// BNStats adds, per channel, the sums of x−shift and (x−shift)² over x's
// rows into s1 and s2.
func BNStats(x []float32, c int, shift []float32, s1, s2 []float64) {
	_, _, _ = shift[c-1], s1[c-1], s2[c-1]
	C.ppn_bn_stats(f32(x), rowsOf(x, c), C.int(c), f32(shift), f64(s1), f64(s2))
}

// BNNormalize writes y = (x−mean)·scale + bias, or with relu max(that, 0).
func BNNormalize(x, y []float32, c int, mean, scale, bias []float32, relu bool) {
	_, _, _ = mean[c-1], scale[c-1], bias[c-1]
	if len(y) != len(x) {
		panic("dnnl: BNNormalize: x and y differ in length")
	}
	C.ppn_bn_normalize(f32(x), f32(y), rowsOf(x, c), C.int(c), f32(mean), f32(scale), f32(bias), cbool(relu))
}

// BNGradSums adds, per channel, the sums of dy and dy·x̂ (x̂ = (x−mean)·inv)
// into sdy and sdyx. Unless y is nil, dy counts as 0 where y ≤ 0 (the
// gradient through a ReLU whose output is y).
func BNGradSums(x, y, dy []float32, c int, mean, inv []float32, sdy, sdyx []float64) {
	_, _, _, _ = mean[c-1], inv[c-1], sdy[c-1], sdyx[c-1]
	if len(dy) != len(x) || y != nil && len(y) != len(x) {
		panic("dnnl: BNGradSums: x, y and dy differ in length")
	}
	C.ppn_bn_grad_sums(f32(x), f32(y), f32(dy), rowsOf(x, c), C.int(c), f32(mean), f32(inv), f64(sdy), f64(sdyx))
}

// BNInputGrad writes dx = k·(dy − a − x̂·b), with dy as in BNGradSums.
func BNInputGrad(x, y, dy, dx []float32, c int, mean, inv, k, a, b []float32) {
	_, _, _, _, _ = mean[c-1], inv[c-1], k[c-1], a[c-1], b[c-1]
	if len(dy) != len(x) || len(dx) != len(x) || y != nil && len(y) != len(x) {
		panic("dnnl: BNInputGrad: x, y, dy and dx differ in length")
	}
	C.ppn_bn_dx(f32(x), f32(y), f32(dy), f32(dx), rowsOf(x, c), C.int(c), f32(mean), f32(inv), f32(k), f32(a), f32(b))
}

// The Team functions run the kernels above over a whole tensor in chunks
// on oneDNN's OpenMP team, from the calling OS thread: chunk k takes rows
// [k·rows/chunks, (k+1)·rows/chunks), and its sums go to parts[2kc:2kc+c]
// and parts[(2k+1)c:(2k+2)c].

func BNStatsTeam(chunks int, x []float32, c int, shift []float32, parts []float64) {
	_, _ = shift[c-1], parts[2*chunks*c-1]
	C.ppn_bn_stats_team(C.int(chunks), f32(x), rowsOf(x, c), C.int(c), f32(shift), f64(parts))
}

func BNNormalizeTeam(chunks int, x, y []float32, c int, mean, scale, bias []float32, relu bool) {
	_, _, _ = mean[c-1], scale[c-1], bias[c-1]
	if len(y) != len(x) {
		panic("dnnl: BNNormalize: x and y differ in length")
	}
	C.ppn_bn_normalize_team(C.int(chunks), f32(x), f32(y), rowsOf(x, c), C.int(c), f32(mean), f32(scale), f32(bias), cbool(relu))
}

func BNGradSumsTeam(chunks int, x, y, dy []float32, c int, mean, inv []float32, parts []float64) {
	_, _, _ = mean[c-1], inv[c-1], parts[2*chunks*c-1]
	if len(dy) != len(x) || y != nil && len(y) != len(x) {
		panic("dnnl: BNGradSums: x, y and dy differ in length")
	}
	C.ppn_bn_grad_sums_team(C.int(chunks), f32(x), f32(y), f32(dy), rowsOf(x, c), C.int(c), f32(mean), f32(inv), f64(parts))
}

func BNInputGradTeam(chunks int, x, y, dy, dx []float32, c int, mean, inv, k, a, b []float32) {
	_, _, _, _, _ = mean[c-1], inv[c-1], k[c-1], a[c-1], b[c-1]
	if len(dy) != len(x) || len(dx) != len(x) || y != nil && len(y) != len(x) {
		panic("dnnl: BNInputGrad: x, y, dy and dx differ in length")
	}
	C.ppn_bn_dx_team(C.int(chunks), f32(x), f32(y), f32(dy), f32(dx), rowsOf(x, c), C.int(c), f32(mean), f32(inv), f32(k), f32(a), f32(b))
}

// ElementwiseTeam runs op over y in chunks.
func ElementwiseTeam(chunks, op int, a, b, y []float32) {
	if len(y) != len(a) || b != nil && len(b) != len(a) {
		panic("dnnl: elementwise: a, b and y differ in length")
	}
	C.ppn_ew_team(C.int(chunks), C.int(op), f32(a), f32(b), f32(y), C.size_t(len(a)))
}
