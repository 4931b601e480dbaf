package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
)

func TestGradCheckArith(t *testing.T) {
	// Divisors stay in [0.5, 1.5] in magnitude, so that a finite step of
	// 1e-2 sees a smooth quotient.
	divisor := awayIn(0.5, 1.5)
	positive := uniformIn(0.5, 1.5)
	var cases []gradCase
	for _, s := range [][]int{{5}, {2, 3, 4}} {
		for _, op := range []string{"sub", "mul", "div"} {
			op := op
			opt := nntest.Options{}
			if op == "div" {
				opt.Input = divisor
			}
			cases = append(cases, gradCase{fmt.Sprintf("binary-%s%v", op, s), func() nn.Layer { return nn.Binary{Op: op} }, [][]int{s, s}, opt})
		}
		for _, sc := range []nn.Scalar{
			{Op: "add", C: 1.7}, {Op: "sub", C: -0.3}, {Op: "rsub", C: 1.7}, {Op: "mul", C: -0.3},
			{Op: "div", C: 1.7}, {Op: "div", C: -0.3}, {Op: "rdiv", C: 1.7}, {Op: "rdiv", C: -0.3},
			{Op: "pow", C: 2}, {Op: "pow", C: 3}, {Op: "pow", C: 0.5}, {Op: "pow", C: -1.5}, {Op: "pow", C: 0},
		} {
			sc := sc
			opt := nntest.Options{}
			switch {
			case sc.Op == "rdiv":
				opt.Input = divisor
			case sc.Op == "pow" && sc.C != float32(int(sc.C)):
				opt.Input = positive
			}
			cases = append(cases, gradCase{fmt.Sprintf("scalar-%s%v%v", sc.Op, sc.C, s), func() nn.Layer { return sc }, [][]int{s}, opt})
		}
	}
	cases = append(cases,
		gradCase{"linear-nobias", func() nn.Layer { return &nn.Linear{In: 6, Out: 4, NoBias: true} }, [][]int{{6}}, nntest.Options{}},
		gradCase{"linear-transposed", func() nn.Layer { return &nn.Linear{In: 6, Out: 4, Transposed: true} }, [][]int{{6}}, nntest.Options{}},
		gradCase{"linear-transposed-nobias", func() nn.Layer { return &nn.Linear{In: 6, Out: 4, Transposed: true, NoBias: true} }, [][]int{{6}}, nntest.Options{}},
		gradCase{"linear-transposed-flattens", func() nn.Layer { return &nn.Linear{In: 12, Out: 3, Transposed: true, He: true} }, [][]int{{2, 3, 2}}, nntest.Options{}},
	)
	runGradCases(t, cases)
}

// Binary returns exactly the gradients asked for, the same with any
// combination of need, and both inputs' gradients agree with its formulas.
func TestBinaryNeed(t *testing.T) {
	const n = 3
	a, b := ramp(n, 2, 5), ramp(n, 2, 5)
	for i := range nn.F32(b) {
		nn.F32(b)[i] = 1.5 + nn.F32(b)[i]*0.7 + float32(i%3)*0.1
	}
	dout := nn.New(n, 2, 5)
	for i := range nn.F32(dout) {
		nn.F32(dout)[i] = float32(math.Cos(float64(i)))
	}
	for _, op := range []string{"sub", "mul", "div"} {
		l := nn.Binary{Op: op}
		if _, err := l.Build([][]int{{2, 5}, {2, 5}}); err != nil {
			t.Fatal(err)
		}
		_, all, _ := runPass(t, l, 1, []*nn.Tensor{a, b}, dout, []bool{true, true})
		for k := range nn.F32(a) {
			x, y, d := float64(nn.F32(a)[k]), float64(nn.F32(b)[k]), float64(nn.F32(dout)[k])
			var da, db float64
			switch op {
			case "sub":
				da, db = d, -d
			case "mul":
				da, db = d*y, d*x
			case "div":
				da, db = d/y, -d*x/(y*y)
			}
			if math.Abs(float64(all[0][k])-da) > 1e-6*math.Abs(da) || math.Abs(float64(all[1][k])-db) > 1e-6*math.Abs(db) {
				t.Fatalf("%s[%d]: gradients %v, %v, want %v, %v", op, k, all[0][k], all[1][k], da, db)
			}
		}
		for _, need := range [][]bool{{true, false}, {false, true}, {false, false}} {
			_, din, _ := runPass(t, l, 1, []*nn.Tensor{a, b}, dout, need)
			for i := range need {
				switch {
				case !need[i] && din[i] != nil:
					t.Errorf("%s need %v: got a gradient for input %d", op, need, i)
				case need[i] && din[i] == nil:
					t.Errorf("%s need %v: no gradient for input %d", op, need, i)
				case need[i]:
					sameBits(t, fmt.Sprintf("%s need %v input %d", op, need, i), din[i], all[i])
				}
			}
		}
	}
}

// Scalar's operations are single float32 operations, bit for bit (x/C a
// division, not a multiplication by 1/C); pow is float64 rounded once.
func TestScalarExact(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := nn.New(4, 50)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(r.NormFloat64() * 3)
	}
	const c = float32(0.3) // 1/0.3 is inexact: x·(1/c) differs from x/c
	ops := map[string]func(v float32) float32{
		"add": func(v float32) float32 { return v + c }, "sub": func(v float32) float32 { return v - c },
		"rsub": func(v float32) float32 { return c - v }, "mul": func(v float32) float32 { return v * c },
		"div": func(v float32) float32 { return v / c }, "rdiv": func(v float32) float32 { return c / v },
		"pow": func(v float32) float32 { return float32(math.Pow(float64(v), float64(c))) },
	}
	for op, f := range ops {
		got := nn.F32(forward(t, nn.Scalar{Op: op, C: c}, x))
		for i, v := range nn.F32(x) {
			want := f(v)
			if math.Float32bits(got[i]) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got[i]))) {
				t.Fatalf("%s: %v op %v = %v, want %v", op, v, c, got[i], want)
			}
		}
	}
	// pow 2 squares exactly, as PyTorch does.
	sq := nn.F32(forward(t, nn.Scalar{Op: "pow", C: 2}, x))
	for i, v := range nn.F32(x) {
		if sq[i] != v*v {
			t.Fatalf("pow 2 of %v = %v, want %v", v, sq[i], v*v)
		}
	}
}

// mod takes the divisor's sign (Python's %), fmod the dividend's (C's).
func TestScalarMod(t *testing.T) {
	x := nn.FromData([]float32{7, -7, 6, -1, 0}, 5, 1)
	for _, c := range []struct {
		op   string
		c    float32
		want []float32
	}{
		{"mod", 3, []float32{1, 2, 0, 2, 0}},
		{"mod", -3, []float32{-2, -1, 0, -1, 0}},
		{"fmod", 3, []float32{1, -1, 0, -1, 0}},
	} {
		if got := nn.F32(forward(t, nn.Scalar{Op: c.op, C: c.c}, x)); !slices.Equal(got, c.want) {
			t.Errorf("%s %v of [7 -7 6 -1 0] = %v, want %v", c.op, c.c, got, c.want)
		}
	}
}

func TestArithBuildErrors(t *testing.T) {
	for _, c := range []struct {
		l  nn.Layer
		in [][]int
	}{
		{nn.Binary{Op: "add"}, [][]int{{3}, {3}}},
		{nn.Binary{Op: "mul"}, [][]int{{3}, {4}}},
		{nn.Binary{Op: "mul"}, [][]int{{3}}},
		{nn.Scalar{Op: "max", C: 1}, [][]int{{3}}},
		{&nn.Linear{In: 5, Out: 2, Transposed: true}, [][]int{{4}}},
	} {
		if _, err := c.l.Build(c.in); err == nil {
			t.Errorf("%s built on %v", c.l.Kind(), c.in)
		}
	}
}

// A Transposed Linear holding Wᵀ computes the same bits as the default
// one, and gives the transpose of its weight gradient; NoBias drops the
// bias parameter and adds nothing.
func TestLinearTransposedNoBias(t *testing.T) {
	const n, in, out = 5, 7, 3
	x, dout := ramp(n, in), nn.New(n, out)
	for i := range nn.F32(dout) {
		nn.F32(dout)[i] = float32(math.Cos(float64(3 * i)))
	}
	for _, noBias := range []bool{false, true} {
		std := &nn.Linear{In: in, Out: out, NoBias: noBias}
		tr := &nn.Linear{In: in, Out: out, NoBias: noBias, Transposed: true}
		for _, l := range []*nn.Linear{std, tr} {
			if _, err := l.Build([][]int{{in}}); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := len(tr.Params()), 2-btoi(noBias); got != want || len(std.Params()) != want {
			t.Fatalf("NoBias %v: %d and %d parameters, want %d", noBias, len(std.Params()), got, want)
		}
		if noBias && (std.B != nil || tr.B != nil) {
			t.Fatal("NoBias layer has a bias")
		}
		if s := tr.W.Value.Shape(); s[0] != in || s[1] != out {
			t.Fatalf("transposed weight is %v, want [%d %d]", s, in, out)
		}
		randomParams(std, 11)
		w, wt := nn.F32(std.W.Value), nn.F32(tr.W.Value)
		for o := 0; o < out; o++ {
			for i := 0; i < in; i++ {
				wt[i*out+o] = w[o*in+i]
			}
		}
		if !noBias {
			copy(nn.F32(tr.B.Value), nn.F32(std.B.Value))
		}
		y1, d1, p1 := runPass(t, std, 1, []*nn.Tensor{x}, dout, []bool{true})
		y2, d2, p2 := runPass(t, tr, 1, []*nn.Tensor{x}, dout, []bool{true})
		sameBits(t, "output", y2, y1)
		sameBits(t, "input gradient", d2[0], d1[0])
		gt := make([]float32, in*out)
		for o := 0; o < out; o++ {
			for i := 0; i < in; i++ {
				gt[i*out+o] = p1[0][o*in+i]
			}
		}
		sameBits(t, "weight gradient", p2[0], gt)
		if !noBias {
			sameBits(t, "bias gradient", p2[1], p1[1])
			continue
		}
		// Without a bias, y = x·Wᵀ exactly as the GEMM alone computes it.
		ref := make([]float32, n*out)
		gonum1(t).Sgemm(false, true, n, out, in, 1, nn.F32(x), in, w, in, 0, ref, out)
		sameBits(t, "output without bias", y1, ref)
	}
}
