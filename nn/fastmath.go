package nn

import "math"

// Elementwise math for the hot loops (softmax, the cross-entropy, GELU,
// sigmoid, tanh, the recurrent cells): exp, e^x − 1, log, tanh, the
// sigmoid and the normal distribution in float64 from additions,
// multiplications and divisions alone, each product rounded before it is
// added, so that the bits are the same on every architecture (unlike the
// math package's, which Go may fuse into multiply-adds on arm64). Their
// relative error is below 1e-8, far inside float32's 6e-8, the precision
// the layers store. On amd64 the kernels of fastmath_amd64.s run the same
// operations four values at a time.

// ln 2 in two parts (the first with trailing zero bits, so that k·ln2Hi is
// exact for the k that exp meets), and log2(e).
const (
	ln2Hi = 6.93147180369123816490e-01
	ln2Lo = 1.90821492927058770002e-10
	log2e = 1.4426950408889634
)

// expReduce is x = k·ln2 + r with k an integer and |r| <= ln2/2.
func expReduce(x float64) (k, r float64) {
	k = math.Floor(float64(x*log2e) + 0.5)
	return k, float64(x-float64(k*ln2Hi)) - float64(k*ln2Lo)
}

// expSeries is (e^r − 1)/r by its Taylor series to r^9/10!: 1 + r/2 +
// r²/6 + ...
func expSeries(r float64) float64 {
	p := 1.0 / 3628800
	p = float64(p*r) + 1.0/362880
	p = float64(p*r) + 1.0/40320
	p = float64(p*r) + 1.0/5040
	p = float64(p*r) + 1.0/720
	p = float64(p*r) + 1.0/120
	p = float64(p*r) + 1.0/24
	p = float64(p*r) + 1.0/6
	p = float64(p*r) + 0.5
	return float64(p*r) + 1
}

// expFast is e^x: x = k·ln2 + r with |r| <= ln2/2, e^r by its Taylor
// series to r^10/10! (relative error below 1e-11), times 2^k.
func expFast(x float64) float64 {
	switch {
	case x != x:
		return x
	case x > 709.78:
		return math.Inf(1)
	case x < -745.1:
		return 0
	}
	k, r := expReduce(x)
	p := float64(expSeries(r)*r) + 1
	ki := int(k)
	if ki < -1022 { // subnormal results: scale in two steps
		return float64(p*math.Float64frombits(uint64(ki+1022+1023)<<52)) * 0x1p-1022
	}
	return float64(p * math.Float64frombits(uint64(ki+1023)<<52))
}

// expm1Fast is e^x − 1 (NaN for NaN; −1 below −708, where e^x is below
// 2^-1022) by expFast's series without its last term, so that it keeps
// its precision near 0: with x = k·ln2 + r, 2^k·q + (2^k − 1) where
// q = e^r − 1.
func expm1Fast(x float64) float64 {
	if x < -708 {
		return -1
	}
	k, r := expReduce(x)
	q := float64(expSeries(r) * r)
	s := math.Float64frombits(uint64(int(k)+1023) << 52)
	return float64(s*q) + (s - 1)
}

// tanhFast is tanh(x) = sign(x)·e/(e + 2), e = e^(2|x|) − 1 (expm1Fast);
// ±1 beyond |x| = 20, where tanh is 1 within 1e-17.
func tanhFast(x float64) float64 {
	t := math.Abs(x)
	y := 1.0
	if !(t > 20) {
		e := expm1Fast(2 * t)
		y = e / (e + 2)
	}
	return math.Copysign(y, x)
}

// logFast is ln x: x = 2^e·m with m in [√½, √2), ln m = 2·atanh(s) for
// s = (m − 1)/(m + 1), |s| < 0.172, by its series to s^21 (relative error
// below 1e-15).
func logFast(x float64) float64 {
	switch {
	case x == 0:
		return math.Inf(-1)
	case !(x > 0) || math.IsInf(x, 1):
		return math.Log(x) // NaN, or +Inf
	}
	m, e := math.Frexp(x)
	if m < math.Sqrt2/2 {
		m, e = 2*m, e-1
	}
	s := (m - 1) / (m + 1)
	s2 := float64(s * s)
	p := 1.0 / 21
	for _, c := range [...]float64{1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3, 1} {
		p = float64(p*s2) + c
	}
	k := float64(e)
	return float64(k*ln2Hi) + (float64(k*ln2Lo) + float64(2*float64(s*p)))
}

// cosPi is cos(π·t) for t in [0, 1] by Taylor series in rounded products
// (within 4e-16 of math.Cos; the rate schedule's, the same on every
// architecture): cos(πt) = −cos(π(1 − t)), and on [0, ½] the cosine or the
// sine of the argument nearer 0.
func cosPi(t float64) float64 {
	sign := 1.0
	if t > 0.5 {
		t, sign = 1-t, -1 // exact
	}
	if t > 0.25 {
		return sign * sinTaylor(float64(math.Pi*(0.5-t))) // 0.5 − t is exact
	}
	return sign * cosTaylor(float64(math.Pi*t))
}

// sinTaylor is sin x to x^15/15! and cosTaylor cos x to x^16/16!, for
// |x| <= π/4.
func sinTaylor(x float64) float64 {
	x2 := float64(x * x)
	p := -1.0 / 1307674368000
	for _, c := range [...]float64{1.0 / 6227020800, -1.0 / 39916800, 1.0 / 362880, -1.0 / 5040, 1.0 / 120, -1.0 / 6, 1} {
		p = float64(p*x2) + c
	}
	return float64(p * x)
}

func cosTaylor(x float64) float64 {
	x2 := float64(x * x)
	p := 1.0 / 20922789888000
	for _, c := range [...]float64{-1.0 / 87178291200, 1.0 / 479001600, -1.0 / 3628800, 1.0 / 40320, -1.0 / 720, 1.0 / 24, -0.5, 1} {
		p = float64(p*x2) + c
	}
	return p
}

// sigmoidFast is 1/(1 + e^−x) by expFast.
func sigmoidFast(x float64) float64 { return 1 / (1 + expFast(-x)) }

// sigmoidRange sets ys[i] = float32(sigmoidFast(float64(xs[i]))) and
// tanhRange ys[i] = float32(tanhFast(float64(xs[i]))) (xs and ys may be
// the same): the vector kernels' where they have them, else, and for the
// four values they leave, the functions'.
func sigmoidRange(xs, ys []float32) {
	kernelThenLoop(len(xs), func(i int) int { return sigmoidVector(xs[i:], ys[i:]) },
		func(i int) { ys[i] = float32(sigmoidFast(float64(xs[i]))) })
}

func tanhRange(xs, ys []float32) {
	kernelThenLoop(len(xs), func(i int) int { return tanhVector(xs[i:], ys[i:]) },
		func(i int) { ys[i] = float32(tanhFast(float64(xs[i]))) })
}

// kernelThenLoop runs n values from 0: kernel(i) on the values from i,
// which does as many as it takes and says how many, then loop on each of
// the (up to four) values it leaves, and so on to the end.
func kernelThenLoop(n int, kernel func(i int) int, loop func(i int)) {
	for i := 0; i < n; {
		i += kernel(i)
		for end := min(i+4, n); i < end; i++ {
			loop(i)
		}
	}
}

// normal returns the standard normal distribution's CDF Φ(x) and density
// φ(x). Φ comes from the Mills ratio R(t) = (1 - Φ(t))/φ(t), smooth and
// fitted by polynomials on [0, 12) (testdata/fit_mills.py), and its
// asymptotic series beyond: Φ(x) = 1 - φ(x)·R(x) for x >= 0, φ(x)·R(-x)
// below, with no cancellation where Φ is small.
func normal(x float64) (cdf, pdf float64) {
	if x != x {
		return x, x
	}
	const invSqrt2Pi = 0.3989422804014327
	pdf = invSqrt2Pi * expFast(float64(-0.5*x)*x)
	t := math.Abs(x)
	var r float64
	if t < 12 {
		k := int(t)
		c := &millsCoef[k]
		u := t - (float64(k) + 0.5)
		r = c[8]
		for j := 7; j >= 0; j-- {
			r = float64(r*u) + c[j]
		}
	} else {
		// 1/t·(1 - 1/t² + 3/t⁴ - 15/t⁶ + 105/t⁸): within 2e-8 of R at t = 12.
		s := 1 / (t * t)
		r = 105
		for _, c := range [...]float64{-15, 3, -1, 1} {
			r = float64(r*s) + c
		}
		r /= t
	}
	q := float64(pdf * r)
	if x >= 0 {
		return 1 - q, pdf
	}
	return q, pdf
}

// millsCoef[k] are the coefficients, constant term first, of R(t) on
// [k, k+1) as a polynomial in t - k - 0.5 (relative error below 3e-9).
var millsCoef = [12][9]float64{
	{0.8763644565909305, -0.5618177371759449, 0.2977277578900432, -0.13765313275783697, 0.05722640869320586, -0.021781343979694154, 0.007710539655403177, -0.0027031453806557696, 0.0008488805858178241},
	{0.5158156382262467, -0.22627654023557062, 0.08820041044996318, -0.0313254378860675, 0.010303165279495555, -0.003172266843162674, 0.000923064056132716, -0.0002653742687471095, 7.022092904662715e-05},
	{0.3542651113305262, -0.11433722142549706, 0.034211028424208235, -0.009603230062178234, 0.002550751347565239, -0.0006450788383627784, 0.0001562097428916333, -3.7387620153595014e-05, 8.403279207414027e-06},
	{0.26656776896831264, -0.06701280857632036, 0.016011469396741047, -0.003657557078980606, 0.0008025071030415277, -0.00016972975778060118, 3.472014438443695e-05, -7.0295501359396506e-06, 1.3563005268224532e-06},
	{0.21257058044204608, -0.04343238800459548, 0.008562417193794174, -0.0016338372090190843, 0.00030253790361478567, -5.4478545906277976e-05, 9.559464007224961e-06, -1.6628209550617598e-06, 2.786121740427915e-07},
	{0.1763229857571058, -0.03022357833455618, 0.00504665245417816, -0.0008223300184679205, 0.0001309594568816186, -2.0409548778133054e-05, 3.1166558414952305e-06, -4.7246867325156884e-07, 6.953887350391594e-08},
	{0.1504369887362702, -0.02215957321389182, 0.0031998814216845886, -0.0004534480099574466, 6.311737457036504e-05, -8.63674119173652e-06, 1.1627476666831164e-06, -1.555885660309285e-07, 2.0332652184151804e-08},
	{0.13107935580449245, -0.016904831466203724, 0.0021465599035404574, -0.00026854406889608156, 3.311985858673871e-05, -4.028943999756508e-06, 4.836808273012134e-07, -5.7771404726736314e-08, 6.768505045329218e-09},
	{0.1160820633859829, -0.013302461219114175, 0.0015055715115874833, -0.00016836779211679956, 1.861132413225605e-05, -2.0342798359385053e-06, 2.1994776346900754e-07, -2.3679159255607267e-08, 2.5085228116949897e-09},
	{0.10413358157959896, -0.010730974993802793, 0.0010946595691580477, -0.0001105696962836285, 1.1061865587458348e-05, -1.0963847162592751e-06, 1.0768322908916122e-07, -1.0538014194594278e-08, 1.0195662980549918e-09},
	{0.09439676005522503, -0.008834019420138194, 0.0008197780718588565, -7.544988884492433e-05, 6.888560483453422e-06, -6.239964919496605e-07, 5.609239721593419e-08, -5.02632220289454e-09, 4.4424268708098456e-10},
	{0.0863133848735501, -0.00739607395418015, 0.0006292672002430453, -5.316705065025456e-05, 4.461529440713534e-06, -3.71889824993253e-07, 3.0798083372474e-08, -2.5432724815033114e-09, 2.0394281818880597e-10},
}
