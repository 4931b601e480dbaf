//go:build !purego

package nn

import (
	"math"
	"unsafe"
)

// The AVX2 kernels of fastmath.go's loops (fastmath_amd64.s), and the
// functions that call them on a slice's leading values, none beyond the
// shortest slice's end.

// geluAVX2 computes GELU's output, Φ and φ (see GELU.Forward) of x[0:n],
// n a positive multiple of 4, four values at a time with normal's and
// expFast's operations in their order, and returns how many it did: it
// stops before the first four with a value whose magnitude is not below
// 12 (or NaN), which normal's other branches take.
//
//go:noescape
func geluAVX2(x, y, cdf, pdf *float32, n int, k *vecCoef) int

// softmaxExpAVX2 sets y[i] = float32(e) for e = expFast(float64(x[i]) −
// m), i < n, n a positive multiple of 4, four at a time with expFast's
// operations in their order, adds the e's to *sum in order, and returns
// how many it did: it stops before the first four with an exponent
// outside [−708, 709] that is not below −745.1 (or NaN), which expFast's
// other branches take.
//
//go:noescape
func softmaxExpAVX2(x, y *float32, n int, m float64, sum *float64, k *vecCoef) int

// sigmoidAVX2 sets y[i] = float32(sigmoidFast(float64(x[i]))) and
// tanhAVX2 y[i] = float32(tanhFast(float64(x[i]))), i < n, n a positive
// multiple of 4, four at a time with those functions' operations in their
// order (x and y may be the same); they return how many they did,
// stopping before the first four with a value beyond ±708 (sigmoid), ±20
// (tanh) or NaN, which the functions' other branches take.
//
//go:noescape
func sigmoidAVX2(x, y *float32, n int, k *vecCoef) int

//go:noescape
func tanhAVX2(x, y *float32, n int, k *vecCoef) int

// normalizeAVX2 is normalizeRow on y[0:n], n a positive multiple of 4,
// four values at a time.
//
//go:noescape
func normalizeAVX2(y *float32, n int, inv float64, k *vecCoef)

// vecCoef are the kernels' constants, each broadcast to four lanes, and
// millsCoef transposed (mills[j][k] = millsCoef[k][j]): Go computes them,
// so they are normal's bits.
type vecCoef struct {
	v     [vecConsts][4]float64
	mills [9][12]float64
}

// The rows of vecCoef.v (fastmath_amd64.s names their offsets).
const (
	gAbs = iota
	gTwelve
	gMinusHalf
	gLog2e
	gHalf
	gLn2Hi
	gLn2Lo
	gTaylor     // 11 rows: the first coefficient, then the 10 added
	gInvSqrt2Pi = gTaylor + 11
	gOne        = gInvSqrt2Pi + 1
	gBias       = gOne + 1  // int64 1023 in each lane
	gMod4       = gBias + 1 // int64 3
	gHigh1      = gMod4 + 1 // int64 1<<32
	gFour       = gHigh1 + 1
	gEight      = gFour + 1 // int64 4 and 8
	gExpLow     = gEight + 1
	gExpHigh    = gExpLow + 1
	gExpZero    = gExpHigh + 1 // the exponents expFast takes here, and below which e^x is 0
	gTanhMax    = gExpZero + 1 // 20
	gTwo        = gTanhMax + 1
	gTiny       = gTwo + 1 // 2^-126, float32's smallest normal number
	vecConsts   = gTiny + 1
)

// The offsets fastmath_amd64.s uses.
var (
	_ [224]struct{} = [gTaylor * 32]struct{}{}
	_ [576]struct{} = [gInvSqrt2Pi * 32]struct{}{}
	_ [608]struct{} = [gOne * 32]struct{}{}
	_ [640]struct{} = [gBias * 32]struct{}{}
	_ [672]struct{} = [gMod4 * 32]struct{}{}
	_ [768]struct{} = [gEight * 32]struct{}{}
	_ [800]struct{} = [gExpLow * 32]struct{}{}
	_ [864]struct{} = [gExpZero * 32]struct{}{}
	_ [896]struct{} = [gTanhMax * 32]struct{}{}
	_ [928]struct{} = [gTwo * 32]struct{}{}
	_ [960]struct{} = [gTiny * 32]struct{}{}
	_ [992]struct{} = [unsafe.Offsetof(vecCoef{}.mills)]struct{}{}
)

var vecK = func() *vecCoef {
	k := &vecCoef{}
	set := func(i int, v float64) { k.v[i] = [4]float64{v, v, v, v} }
	set(gAbs, math.Float64frombits(1<<63-1))
	set(gTwelve, 12)
	set(gMinusHalf, -0.5)
	set(gLog2e, 1.4426950408889634)
	set(gHalf, 0.5)
	set(gLn2Hi, 6.93147180369123816490e-01)
	set(gLn2Lo, 1.90821492927058770002e-10)
	for i, c := range [11]float64{1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1, 1} {
		set(gTaylor+i, c)
	}
	set(gInvSqrt2Pi, 0.3989422804014327)
	set(gOne, 1)
	set(gExpLow, -708)
	set(gExpHigh, 709)
	set(gExpZero, -745.1)
	set(gTanhMax, 20)
	set(gTwo, 2)
	set(gTiny, 0x1p-126)
	for i, v := range [...]uint64{gBias: 1023, gMod4: 3, gHigh1: 1 << 32, gFour: 4, gEight: 8} {
		if v != 0 {
			set(i, math.Float64frombits(v))
		}
	}
	for j := range k.mills {
		for i := range millsCoef {
			k.mills[j][i] = millsCoef[i][j]
		}
	}
	return k
}()

// vector4 is how many leading values of n the four-lane kernels take (0
// without AVX2), as vector8 is for the eight-lane ones.
func vector4(n int) int {
	if !hasAVX2 {
		return 0
	}
	return n &^ 3
}

// expVector is softmaxExpAVX2 on the leading values of x (none without
// AVX2).
func expVector(x, y []float32, m float64, sum *float64) int {
	n := vector4(min(len(x), len(y)))
	if n == 0 {
		return 0
	}
	return softmaxExpAVX2(&x[0], &y[0], n, m, sum, vecK)
}

// sigmoidVector and tanhVector are sigmoidAVX2 and tanhAVX2 on the
// leading values of x (none without AVX2).
func sigmoidVector(x, y []float32) int {
	n := vector4(min(len(x), len(y)))
	if n == 0 {
		return 0
	}
	return sigmoidAVX2(&x[0], &y[0], n, vecK)
}

func tanhVector(x, y []float32) int {
	n := vector4(min(len(x), len(y)))
	if n == 0 {
		return 0
	}
	return tanhAVX2(&x[0], &y[0], n, vecK)
}

// normalizeVector is normalizeAVX2 on the leading values of y; it
// returns how many it did (none without AVX2).
func normalizeVector(y []float32, inv float64) int {
	n := vector4(len(y))
	if n > 0 {
		normalizeAVX2(&y[0], n, inv, vecK)
	}
	return n
}

// geluVector is how many leading values of x geluAVX2 computed (0
// without AVX2).
func geluVector(x, y, cdf, pdf []float32) int {
	n := vector4(min(len(x), len(y), len(cdf), len(pdf)))
	if n == 0 {
		return 0
	}
	return geluAVX2(&x[0], &y[0], &cdf[0], &pdf[0], n, vecK)
}
