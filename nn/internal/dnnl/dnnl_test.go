package dnnl_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn/internal/dnnl"
)

func need(t *testing.T) {
	t.Helper()
	if !dnnl.Available {
		if _, err := dnnl.NewConv(dnnl.ConvGeom{}); !errors.Is(err, dnnl.ErrUnavailable) {
			t.Fatalf("NewConv without oneDNN: %v, want ErrUnavailable", err)
		}
		t.Skip("built without oneDNN (tag dnnl)")
	}
}

// within checks got against want within tol of want's largest magnitude.
func within(t *testing.T, name string, tol float64, got, want []float64) {
	t.Helper()
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	for i := range want {
		if d := math.Abs(got[i] - want[i]); d > tol*scale || math.IsNaN(d) {
			t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
		}
	}
}

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// The batch normalisation kernels against their loops written out in
// float64, for channel counts that exercise every block size (1 to 4
// vectors of 16), the one-at-a-time tail, and rows that end mid-tile;
// alone and with the ReLU that follows applied in the same passes.
func TestBNKernels(t *testing.T) {
	need(t)
	for _, c := range []int{1, 3, 15, 16, 17, 31, 32, 48, 63, 64, 65, 100, 128, 130, 512} {
		for _, rows := range []int{1, 31, 33, 100} {
			for _, relu := range []bool{false, true} {
				t.Run(fmt.Sprintf("c=%d/rows=%d/relu=%v", c, rows, relu), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(c), uint64(rows)))
					vec := func(n int, base float64) []float32 {
						v := make([]float32, n)
						for i := range v {
							v[i] = float32(base + r.NormFloat64())
						}
						return v
					}
					x, dy := vec(rows*c, 3), vec(rows*c, 0)
					shift, mean, inv, k, a, b := vec(c, 3), vec(c, 3), vec(c, 1), vec(c, 0), vec(c, 0), vec(c, 0)
					s1, s2, sdy, sdyx := make([]float64, c), make([]float64, c), make([]float64, c), make([]float64, c)
					y, dx := make([]float32, rows*c), make([]float32, rows*c)
					dnnl.BNStats(x, c, shift, s1, s2)
					dnnl.BNNormalize(x, y, c, mean, inv, b, relu)
					var out []float32 // the ReLU's output, which masks dy
					if relu {
						out = y
					}
					dnnl.BNGradSums(x, out, dy, c, mean, inv, sdy, sdyx)
					dnnl.BNInputGrad(x, out, dy, dx, c, mean, inv, k, a, b)
					w1, w2, wdy, wdyx := make([]float64, c), make([]float64, c), make([]float64, c), make([]float64, c)
					wy, wdx := make([]float64, rows*c), make([]float64, rows*c)
					for i := 0; i < rows; i++ {
						for j := 0; j < c; j++ {
							o := i*c + j
							d := float64(x[o]) - float64(shift[j])
							w1[j] += d
							w2[j] += d * d
							xhat := (float64(x[o]) - float64(mean[j])) * float64(inv[j])
							wy[o] = xhat + float64(b[j])
							g := float64(dy[o])
							if relu && y[o] <= 0 { // the kernel's own y decides where rounding sits at 0
								wy[o], g = 0, 0
							}
							wdy[j] += g
							wdyx[j] += g * xhat
							wdx[o] = float64(k[j]) * (g - float64(a[j]) - xhat*float64(b[j]))
						}
					}
					within(t, "s1", 1e-5, s1, w1)
					within(t, "s2", 1e-5, s2, w2)
					within(t, "y", 1e-5, f64s(y), wy)
					within(t, "sdy", 1e-5, sdy, wdy)
					within(t, "sdyx", 1e-5, sdyx, wdyx)
					within(t, "dx", 1e-5, f64s(dx), wdx)
				})
			}
		}
	}
}

// A geometry whose output size does not follow from the input is refused
// with an error, not a crash.
func TestNewConvRefusesBadGeometry(t *testing.T) {
	need(t)
	g := dnnl.ConvGeom{N: 2, IC: 3, IH: 8, IW: 8, OC: 4, OH: 5, OW: 8, KH: 3, KW: 3, SH: 1, SW: 1, DH: 1, DW: 1,
		PadT: 1, PadL: 1, PadB: 1, PadR: 1, Groups: 1}
	if _, err := dnnl.NewConv(g); err == nil {
		t.Fatal("NewConv accepted an 8x8 input giving a 5x8 output")
	}
	g.OH = 8
	c, err := dnnl.NewConv(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Impl() {
		if s == "" {
			t.Fatalf("no implementation named: %q", c.Impl())
		}
	}
}
