package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// expFast and normal agree with the math package within 1e-9 relative (Φ
// within 3e-8) across the range the layers meet, and at the edges.
func TestFastMathAgreesWithMath(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worstExp, worstCdf, worstPdf := 0.0, 0.0, 0.0
	for i := 0; i < 200000; i++ {
		x := (r.Float64()*2 - 1) * 60
		if i%2 == 0 {
			x /= 10
		}
		e := expFast(x)
		worstExp = max(worstExp, math.Abs(e-math.Exp(x))/math.Exp(x))
		cdf, pdf := normal(x)
		want := 0.5 * math.Erfc(-x/math.Sqrt2)
		wantPdf := math.Exp(-x*x/2) / math.Sqrt(2*math.Pi)
		if want > 0 {
			worstCdf = max(worstCdf, math.Abs(cdf-want)/max(want, 1e-300))
		}
		if wantPdf > 1e-300 {
			worstPdf = max(worstPdf, math.Abs(pdf-wantPdf)/wantPdf)
		}
	}
	if worstExp > 1e-9 || worstCdf > 3e-8 || worstPdf > 1e-9 {
		t.Errorf("relative errors: exp %.2g, Φ %.2g, φ %.2g", worstExp, worstCdf, worstPdf)
	}
	t.Logf("relative errors: exp %.2g, Φ %.2g, φ %.2g", worstExp, worstCdf, worstPdf)
	for _, c := range []struct{ x, want float64 }{{0, 1}, {710, math.Inf(1)}, {-746, 0}, {math.Inf(-1), 0}, {math.Inf(1), math.Inf(1)}} {
		if got := expFast(c.x); got != c.want {
			t.Errorf("expFast(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if got := expFast(-740); got <= 0 || math.Abs(got-math.Exp(-740))/math.Exp(-740) > 1e-6 {
		t.Errorf("expFast(-740) = %v, want %v (subnormal)", got, math.Exp(-740))
	}
	if c, p := normal(math.NaN()); !math.IsNaN(c) || !math.IsNaN(p) {
		t.Errorf("normal(NaN) = %v, %v", c, p)
	}
	if c, _ := normal(math.Inf(1)); c != 1 {
		t.Errorf("Φ(+Inf) = %v", c)
	}
	if c, _ := normal(math.Inf(-1)); c != 0 {
		t.Errorf("Φ(-Inf) = %v", c)
	}
}

func BenchmarkFastMath(b *testing.B) {
	xs := make([]float64, 4096)
	for i := range xs {
		xs[i] = float64(i%200)/20 - 5
	}
	var sink float64
	b.Run("expFast", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				sink += expFast(x)
			}
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				sink += math.Exp(x)
			}
		}
	})
	b.Run("normal", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				c, p := normal(x)
				sink += c + p
			}
		}
	})
	b.Run("math.Erfc", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				sink += math.Erfc(x)
			}
		}
	})
	_ = sink
}
