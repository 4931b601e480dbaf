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
	for _, x := range []float64{-1e-9, -0.3, -0.9, -5, -40, -700} {
		if got, want := expm1Fast(x), math.Expm1(x); math.Abs(got-want) > 1e-15*math.Max(1, math.Abs(want)) && math.Abs(got-want) > 1e-12*math.Abs(want) {
			t.Errorf("expm1Fast(%v) = %v, want %v", x, got, want)
		}
	}
	if got := expm1Fast(-800); got != -1 {
		t.Errorf("expm1Fast(-800) = %v, want -1", got)
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

// tanhFast and sigmoidFast agree with the math package within 5e-12
// relative, near 0 (where e^(2x) − 1 cancels) as well, and at the edges.
func TestTanhSigmoidAgreeWithMath(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	worstTanh, worstSig := 0.0, 0.0
	for i := 0; i < 200000; i++ {
		x := (r.Float64()*2 - 1) * 30
		switch i % 3 {
		case 1:
			x /= 30
		case 2:
			x *= math.Pow(10, -r.Float64()*12)
		}
		if x != 0 {
			worstTanh = max(worstTanh, math.Abs(tanhFast(x)-math.Tanh(x))/math.Abs(math.Tanh(x)))
		}
		want := 1 / (1 + math.Exp(-x))
		worstSig = max(worstSig, math.Abs(sigmoidFast(x)-want)/want)
	}
	if worstTanh > 5e-12 || worstSig > 5e-12 {
		t.Errorf("relative errors: tanh %.2g, sigmoid %.2g", worstTanh, worstSig)
	}
	t.Logf("relative errors: tanh %.2g, sigmoid %.2g", worstTanh, worstSig)
	for _, c := range []struct{ x, tanh, sig float64 }{
		{0, 0, 0.5}, {math.Copysign(0, -1), math.Copysign(0, -1), 0.5}, {25, 1, 1 / (1 + math.Exp(-25))}, {-25, -1, 1 / (1 + math.Exp(25))},
		{math.Inf(1), 1, 1}, {math.Inf(-1), -1, 0}, {800, 1, 1}, {-800, -1, 0},
	} {
		if got := tanhFast(c.x); got != c.tanh || math.Signbit(got) != math.Signbit(c.tanh) {
			t.Errorf("tanhFast(%v) = %v, want %v", c.x, got, c.tanh)
		}
		if got := sigmoidFast(c.x); math.Abs(got-c.sig) > 1e-12*c.sig {
			t.Errorf("sigmoidFast(%v) = %v, want %v", c.x, got, c.sig)
		}
	}
	if !math.IsNaN(tanhFast(math.NaN())) || !math.IsNaN(sigmoidFast(math.NaN())) {
		t.Errorf("tanhFast(NaN) = %v, sigmoidFast(NaN) = %v", tanhFast(math.NaN()), sigmoidFast(math.NaN()))
	}
}

// logFast agrees with math.Log within 1e-15 relative (1e-16 absolute near
// 1), over the sums of exponentials a softmax meets and beyond.
func TestLogAgreesWithMath(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	worst := 0.0
	for i := 0; i < 200000; i++ {
		x := math.Exp((r.Float64()*2 - 1) * 700)
		if i%2 == 0 {
			x = 1 + r.Float64()*1000
		}
		want := math.Log(x)
		worst = max(worst, math.Abs(logFast(x)-want)/max(math.Abs(want), 0.1))
	}
	if worst > 1e-15 {
		t.Errorf("relative error %.2g", worst)
	}
	t.Logf("relative error %.2g", worst)
	for _, c := range []struct{ x, want float64 }{{1, 0}, {0, math.Inf(-1)}, {math.Inf(1), math.Inf(1)}, {2, math.Ln2}} {
		if got := logFast(c.x); got != c.want {
			t.Errorf("logFast(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if !math.IsNaN(logFast(-1)) || !math.IsNaN(logFast(math.NaN())) {
		t.Errorf("logFast(-1) = %v, logFast(NaN) = %v", logFast(-1), logFast(math.NaN()))
	}
}

// cosPi agrees with math.Cos(π·t) within 4e-16 (two ulps of 1) over
// [0, 1], and is exact at its ends and middle.
func TestCosPiAgreesWithMath(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 100000; i++ {
		x := float64(i) / 100000
		worst = max(worst, math.Abs(cosPi(x)-math.Cos(math.Pi*x)))
	}
	if worst > 4e-16 {
		t.Errorf("worst difference %.2g", worst)
	}
	t.Logf("worst difference %.2g", worst)
	for x, want := range map[float64]float64{0: 1, 0.5: 0, 1: -1} {
		if got := cosPi(x); got != want {
			t.Errorf("cosPi(%v) = %v, want %v", x, got, want)
		}
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
