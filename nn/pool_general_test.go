package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
	"github.com/ppnode/ppnode/tensorio"
)

// poolGeom is the geometry shared by MaxPool2D and AvgPool2D.
type poolGeom struct {
	K, Stride, Pad         int
	KH, KW, SH, SW         int
	PadT, PadL, PadB, PadR int
}

func (g poolGeom) max() *nn.MaxPool2D {
	return &nn.MaxPool2D{K: g.K, Stride: g.Stride, Pad: g.Pad, KH: g.KH, KW: g.KW, SH: g.SH, SW: g.SW,
		PadT: g.PadT, PadL: g.PadL, PadB: g.PadB, PadR: g.PadR}
}

func (g poolGeom) avg(include bool) *nn.AvgPool2D {
	return &nn.AvgPool2D{K: g.K, Stride: g.Stride, Pad: g.Pad, KH: g.KH, KW: g.KW, SH: g.SH, SW: g.SW,
		PadT: g.PadT, PadL: g.PadL, PadB: g.PadB, PadR: g.PadR, CountIncludePad: include}
}

var generalPools = []struct {
	name  string
	g     poolGeom
	shape []int
}{
	{"2x2", poolGeom{K: 2}, []int{4, 6, 3}},
	{"3x3-stride2-pad1", poolGeom{K: 3, Stride: 2, Pad: 1}, []int{7, 6, 2}},
	{"3x3-stride1-pad1", poolGeom{K: 3, Stride: 1, Pad: 1}, []int{4, 5, 2}},
	{"window3x2", poolGeom{KH: 3, KW: 2}, []int{7, 6, 2}},
	{"window2x3-stride1x2", poolGeom{KH: 2, KW: 3, SH: 1, SW: 2}, []int{4, 7, 3}},
	{"asym-pads", poolGeom{KH: 3, KW: 2, SH: 2, SW: 1, PadT: 1, PadL: 0, PadB: 2, PadR: 1}, []int{6, 5, 2}},
	{"asym-pads-top-left", poolGeom{K: 3, Stride: 2, PadT: 2, PadL: 1}, []int{5, 6, 3}},
}

// pairwiseDistinct draws inputs at least 5ε apart, so that no finite
// difference makes two elements of a max-pooling window swap.
func pairwiseDistinct() func(r *rand.Rand) float32 {
	perm := rand.New(rand.NewPCG(3, 4)).Perm(4096)
	next := 0
	return func(r *rand.Rand) float32 {
		next++
		return float32(perm[next%len(perm)]-2048) * 0.05
	}
}

func TestGradCheckPool2DGeneral(t *testing.T) {
	for _, c := range generalPools {
		t.Run("max-"+c.name, func(t *testing.T) {
			nntest.GradCheck(t, c.g.max(), [][]int{c.shape}, nntest.Options{Input: pairwiseDistinct()})
		})
		for _, include := range []bool{false, true} {
			t.Run(fmt.Sprintf("avg-%s-include=%v", c.name, include), func(t *testing.T) {
				nntest.GradCheck(t, c.g.avg(include), [][]int{c.shape}, nntest.Options{})
			})
		}
	}
}

// naivePool is pooling written out in float64: y and, for dy, dx. The
// layer has been built (its geometry fields are filled in); avg selects
// average pooling, include counts the padding in the divisor.
func naivePool(g poolGeom, avg, include bool, x, dy []float32, n, h, w, c, ho, wo int) (y, dx []float64) {
	y = make([]float64, n*ho*wo*c)
	dx = make([]float64, len(x))
	for b := 0; b < n; b++ {
		for oy := 0; oy < ho; oy++ {
			for ox := 0; ox < wo; ox++ {
				for ch := 0; ch < c; ch++ {
					yi := ((b*ho+oy)*wo+ox)*c + ch
					var idx []int
					for ky := 0; ky < g.KH; ky++ {
						for kx := 0; kx < g.KW; kx++ {
							iy, ix := oy*g.SH-g.PadT+ky, ox*g.SW-g.PadL+kx
							if iy >= 0 && iy < h && ix >= 0 && ix < w {
								idx = append(idx, ((b*h+iy)*w+ix)*c+ch)
							}
						}
					}
					if !avg {
						best := idx[0]
						for _, i := range idx[1:] {
							if x[i] > x[best] {
								best = i
							}
						}
						y[yi] = float64(x[best])
						dx[best] += float64(dy[yi])
						continue
					}
					count := len(idx)
					if include {
						count = g.KH * g.KW
					}
					for _, i := range idx {
						y[yi] += float64(x[i]) / float64(count)
						dx[i] += float64(dy[yi]) / float64(count)
					}
				}
			}
		}
	}
	return y, dx
}

func maxFields(p *nn.MaxPool2D) poolGeom {
	return poolGeom{KH: p.KH, KW: p.KW, SH: p.SH, SW: p.SW, PadT: p.PadT, PadL: p.PadL, PadB: p.PadB, PadR: p.PadR}
}

func avgFields(p *nn.AvgPool2D) poolGeom {
	return poolGeom{KH: p.KH, KW: p.KW, SH: p.SH, SW: p.SW, PadT: p.PadT, PadL: p.PadL, PadB: p.PadB, PadR: p.PadR}
}

// Forward and backward against pooling written out: max pooling's output
// exactly, the rest within 1e-6 of the largest magnitude.
func TestPool2DNaiveReference(t *testing.T) {
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(13, 14))
	const n = 3
	for _, c := range generalPools {
		t.Run("max-"+c.name, func(t *testing.T) {
			p := c.g.max()
			x, y, dy, dx, _ := runLayer(t, be, p, c.shape, n, r)
			sh := y.Shape()
			wy, wdx := naivePool(maxFields(p), false, false, nn.F32(x), nn.F32(dy), n, c.shape[0], c.shape[1], c.shape[2], sh[1], sh[2])
			closeTo(t, "y", 0, nn.F32(y), wy)
			closeTo(t, "dx", 1e-6, nn.F32(dx), wdx) // overlapping windows add in float32
		})
		for _, include := range []bool{false, true} {
			t.Run(fmt.Sprintf("avg-%s-include=%v", c.name, include), func(t *testing.T) {
				p := c.g.avg(include)
				x, y, dy, dx, _ := runLayer(t, be, p, c.shape, n, r)
				sh := y.Shape()
				wy, wdx := naivePool(avgFields(p), true, include, nn.F32(x), nn.F32(dy), n, c.shape[0], c.shape[1], c.shape[2], sh[1], sh[2])
				closeTo(t, "y", 1e-6, nn.F32(y), wy)
				closeTo(t, "dx", 1e-6, nn.F32(dx), wdx)
			})
		}
	}
}

// Build fills in the defaults as before the general fields (stride: the
// window) and rejects windows that could lie wholly in the padding.
func TestPool2DDefaults(t *testing.T) {
	m := &nn.MaxPool2D{K: 2}
	out, err := m.Build([][]int{{5, 4, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{m.Stride, m.KH, m.KW, m.SH, m.SW, m.PadT, m.PadL, m.PadB, m.PadR}; !nn.SameShape(got, []int{2, 2, 2, 2, 2, 0, 0, 0, 0}) || !nn.SameShape(out, []int{2, 2, 3}) {
		t.Fatalf("MaxPool2D{K: 2}: fields %v, output %v", got, out)
	}
	a := &nn.AvgPool2D{KH: 3, KW: 2, PadB: 1}
	out, err = a.Build([][]int{{5, 4, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{a.KH, a.KW, a.SH, a.SW, a.PadT, a.PadL, a.PadB, a.PadR}; !nn.SameShape(got, []int{3, 2, 3, 2, 0, 0, 1, 0}) || !nn.SameShape(out, []int{2, 2, 3}) {
		t.Fatalf("AvgPool2D{KH: 3, KW: 2, PadB: 1}: fields %v, output %v", got, out)
	}
	if a.Kind() != "avgpool2d" || m.Kind() != "maxpool2d" {
		t.Fatalf("kinds %q, %q", a.Kind(), m.Kind())
	}
	for _, g := range []poolGeom{
		{}, {K: 2, Pad: 2}, {KH: 3, KW: 2, PadL: 2}, {K: 3, PadB: 3}, {K: 2, Stride: -1}, {K: 2, SW: -1},
		{K: 2, PadT: -1}, {K: 7}, {K: -1, KH: 2, KW: 2},
	} {
		if _, err := g.max().Build([][]int{{5, 6, 2}}); err == nil {
			t.Errorf("max pooling %+v accepted", g)
		}
		if _, err := g.avg(false).Build([][]int{{5, 6, 2}}); err == nil {
			t.Errorf("average pooling %+v accepted", g)
		}
	}
}

// Pooling gives the same bits whatever the thread count.
func TestPool2DThreadsSameBits(t *testing.T) {
	var ref [][]float32
	for _, threads := range []int{1, 2, 3} {
		be, err := nn.NewBackend("ppnode-det", threads, true)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(15, 16))
		var got [][]float32
		for _, c := range generalPools {
			for _, l := range []nn.Layer{c.g.max(), c.g.avg(false), c.g.avg(true)} {
				_, y, _, dx, _ := runLayer(t, be, l, c.shape, 7, r)
				got = append(got, nn.F32(y), nn.F32(dx))
			}
		}
		if ref == nil {
			ref = got
			continue
		}
		for i := range got {
			for j := range got[i] {
				if math.Float32bits(got[i][j]) != math.Float32bits(ref[i][j]) {
					t.Fatalf("%d threads: tensor %d element %d is %v, %v with one thread", threads, i, j, got[i][j], ref[i][j])
				}
			}
		}
	}
}

// torchPool computes max_pool2d and avg_pool2d in float64 with their input
// gradients. Pads PyTorch cannot express (asymmetric, or over half the
// window) go through F.pad: -inf for max pooling; for average pooling the
// window sums of the zero-padded input and of a zero-padded ones tensor
// give the divisor without padding.
const torchPool = `
import json
import numpy as np
import torch
import torch.nn.functional as F

t = read_safetensors(sys.argv[1])
out = {}
for i, c in enumerate(json.loads(sys.argv[2])):
    p = "%d/" % i
    x = torch.tensor(t[p + "x"].transpose(0, 3, 1, 2), dtype=torch.float64, requires_grad=True)
    kh, kw = c["k"]
    pt, pl, pb, pr = c["pads"]
    native = pt == pb and pl == pr and 2 * pt <= kh and 2 * pl <= kw
    if c["kind"] == "max":
        if native:
            y = F.max_pool2d(x, (kh, kw), tuple(c["stride"]), (pt, pl))
        else:
            y = F.max_pool2d(F.pad(x, (pl, pr, pt, pb), value=float("-inf")), (kh, kw), tuple(c["stride"]))
    elif native:
        y = F.avg_pool2d(x, (kh, kw), tuple(c["stride"]), (pt, pl), count_include_pad=c["include"])
    else:
        s = F.avg_pool2d(F.pad(x, (pl, pr, pt, pb)), (kh, kw), tuple(c["stride"]))
        if c["include"]:
            y = s
        else:
            ones = torch.ones_like(x)
            y = s / F.avg_pool2d(F.pad(ones, (pl, pr, pt, pb)), (kh, kw), tuple(c["stride"]))
    y.backward(torch.tensor(t[p + "dy"].transpose(0, 3, 1, 2), dtype=torch.float64))
    out[p + "y"] = y.detach().numpy().transpose(0, 2, 3, 1)
    out[p + "dx"] = x.grad.numpy().transpose(0, 2, 3, 1)
write_safetensors(sys.argv[3], out)
`

// Forward and input gradients against PyTorch's max_pool2d and avg_pool2d
// (both count_include_pad modes).
func TestPool2DTorch(t *testing.T) {
	needTorch(t)
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	var (
		specs  []map[string]any
		in     []tensorio.Named
		ys     [][]float32
		dxs    [][]float32
		labels []string
	)
	r := rand.New(rand.NewPCG(17, 18))
	for _, c := range generalPools {
		for _, kind := range []string{"max", "avg-exclude", "avg-include"} {
			var l nn.Layer = c.g.max()
			if kind != "max" {
				l = c.g.avg(kind == "avg-include")
			}
			x, y, dy, dx, _ := runLayer(t, be, l, c.shape, 3, r)
			var g poolGeom // the filled-in geometry
			switch p := l.(type) {
			case *nn.MaxPool2D:
				g = maxFields(p)
			case *nn.AvgPool2D:
				g = avgFields(p)
			}
			i := len(specs)
			pre := fmt.Sprintf("%d/", i)
			in = append(in, named(pre+"x", x), named(pre+"dy", dy))
			ys, dxs = append(ys, nn.F32(y)), append(dxs, nn.F32(dx))
			labels = append(labels, kind+"-"+c.name)
			specs = append(specs, map[string]any{
				"kind": kind[:3], "include": kind == "avg-include", "k": []int{g.KH, g.KW}, "stride": []int{g.SH, g.SW},
				"pads": []int{g.PadT, g.PadL, g.PadB, g.PadR},
			})
		}
	}
	want := torchRun(t, torchPool, specs, in)
	for i := range specs {
		pre := fmt.Sprintf("%d/", i)
		wy, wdx := make([]float64, len(want[pre+"y"])), make([]float64, len(want[pre+"dx"]))
		for j, v := range want[pre+"y"] {
			wy[j] = float64(v)
		}
		for j, v := range want[pre+"dx"] {
			wdx[j] = float64(v)
		}
		closeTo(t, labels[i]+" y", 1e-6, ys[i], wy)
		closeTo(t, labels[i]+" dx", 1e-6, dxs[i], wdx)
	}
}
