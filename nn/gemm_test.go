package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn/internal/sgemm"
)

// chainGemm is the definition of the deterministic GEMM (gemm.go), one
// element at a time.
func chainGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			v := c[i*ldc+j]
			switch beta {
			case 0:
				v = 0
			case 1:
			default:
				v *= beta
			}
			for l := 0; l < k && alpha != 0; l++ {
				ai, bi := i*lda+l, l*ldb+j
				if tA {
					ai = l*lda + i
				}
				if tB {
					bi = j*ldb + l
				}
				av, bv := a[ai], b[bi]
				if s := alpha * av; av != 0 && s != 0 {
					// c + b·s, NaN payloads by SSE's first-source rule.
					switch p := float32(bv * s); {
					case bv != bv:
						v = bv + 0
					case p != p:
						v = p
					default:
						v = p + v
					}
				}
			}
			c[i*ldc+j] = v
		}
	}
}

// gemmCase is one random product.
type gemmCase struct {
	tA, tB        bool
	m, n, k       int
	lda, ldb, ldc int
	alpha, beta   float32
	a, b, c       []float32
}

func (g gemmCase) String() string {
	return fmt.Sprintf("%dx%dx%d tA=%v tB=%v ld=%d,%d,%d alpha=%v beta=%v", g.m, g.n, g.k, g.tA, g.tB, g.lda, g.ldb, g.ldc, g.alpha, g.beta)
}

// randGemmCase draws shapes from small to a few blocks, padded leading
// dimensions, zeros in A (as after ReLU), and now and then the values the
// kernels must hand to the chain: -0 and NaNs in C, infinities and NaNs in B.
func randGemmCase(r *rand.Rand, trial int) gemmCase {
	var g gemmCase
	g.m, g.n, g.k = 1+r.IntN(40), 1+r.IntN(70), r.IntN(60)
	switch trial % 8 {
	case 0: // several column blocks and threads
		g.m, g.n, g.k = 1+r.IntN(100), 300+r.IntN(2000), 1+r.IntN(64)
		if testing.Short() {
			g.m, g.n = 1+r.IntN(40), 300+r.IntN(500)
		}
	case 1: // several k blocks
		g.m, g.n, g.k = 1+r.IntN(50), 1+r.IntN(100), gemmMaxKC+r.IntN(3*gemmMaxKC)
		if testing.Short() {
			g.n = 1 + r.IntN(40)
		}
	case 2: // the shapes of mlp32 and of a convolution
		s := [][3]int{{32, 512, 512}, {512, 512, 32}, {128, 64, 576}, {64, 576, 128}, {7, 16, 1}, {6, 16, 8}}[r.IntN(6)]
		g.m, g.n, g.k = s[0], s[1], s[2]
	}
	g.tA, g.tB = r.IntN(2) == 1, r.IntN(2) == 1
	pad := func() int {
		if r.IntN(3) == 0 {
			return r.IntN(9)
		}
		return 0
	}
	ar, ac := g.m, g.k
	if g.tA {
		ar, ac = g.k, g.m
	}
	br, bc := g.k, g.n
	if g.tB {
		br, bc = g.n, g.k
	}
	g.lda, g.ldb, g.ldc = max(1, ac)+pad(), max(1, bc)+pad(), g.n+pad()
	g.alpha = []float32{1, 1, 1, -1, 0.5, 0, float32(r.NormFloat64()), 1e-30}[r.IntN(8)]
	g.beta = []float32{0, 1, 1, 0.5, -2, float32(r.NormFloat64())}[r.IntN(6)]
	fill := func(rows, cols, ld int, zeros float64) []float32 {
		s := make([]float32, max(0, (rows-1)*ld+cols))
		for i := range s {
			if r.Float64() >= zeros {
				s[i] = float32(r.NormFloat64())
			}
		}
		return s
	}
	g.a = fill(ar, ac, g.lda, []float64{0, 0.3, 0.9}[r.IntN(3)])
	g.b = fill(br, bc, g.ldb, 0.1)
	g.c = fill(g.m, g.n, g.ldc, 0.1)
	special := []float32{float32(math.Copysign(0, -1)), float32(math.NaN()), math.Float32frombits(0x7f800001), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-38}
	for range r.IntN(4) {
		switch x := special[r.IntN(len(special))]; {
		case r.IntN(2) == 0 && len(g.c) > 0:
			g.c[r.IntN(len(g.c))] = x
		case len(g.b) > 0 && trial%3 == 0:
			g.b[r.IntN(len(g.b))] = x
		case len(g.a) > 0:
			g.a[r.IntN(len(g.a))] = x
		}
	}
	return g
}

func bits32(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}

// firstDiff says where two results first differ in their bits.
func firstDiff(got, want []float32) string {
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Sprintf("c[%d] = %v (%#08x), want %v (%#08x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	return "same"
}

// The chain as written in gemm_test.go is the one the gonum backend computed
// (on amd64, where its Saxpy is SSE assembly).
func TestChainIsTheOldGonumBackend(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("gonum's Saxpy is fused Go code on " + runtime.GOARCH)
	}
	r := rand.New(rand.NewPCG(1, 2))
	trials := 300
	if testing.Short() {
		trials = 100
	}
	for trial := range trials {
		g := randGemmCase(r, trial)
		want := slices.Clone(g.c)
		chainGemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, want, g.ldc)
		got := slices.Clone(g.c)
		newGonumOracle(1+trial%3).Sgemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, got, g.ldc)
		if !slices.Equal(bits32(got), bits32(want)) {
			t.Fatalf("trial %d %v: %s", trial, g, firstDiff(got, want))
		}
	}
}

// Every kernel on this CPU, at 1 to 4 threads, gives the bits of the chain
// and of the old gonum backend. Each trial's references are computed once
// for all the kernels (most of the time).
func TestGemmBitsAreTheChain(t *testing.T) {
	trials := 400
	if testing.Short() { // the race pass: a few shapes of each kind run its threads
		trials = 16
	}
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range trials {
		g := randGemmCase(r, trial)
		want := slices.Clone(g.c)
		chainGemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, want, g.ldc)
		var old []float32
		if runtime.GOARCH == "amd64" {
			old = slices.Clone(g.c)
			newGonumOracle(2).Sgemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, old, g.ldc)
		}
		for _, kern := range sgemm.Kernels() {
			for threads := 1; threads <= 4; threads++ {
				be := &detGemm{threads: threads, kern: kern}
				got := slices.Clone(g.c)
				be.Sgemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, got, g.ldc)
				if !slices.Equal(bits32(got), bits32(want)) {
					t.Fatalf("%s: trial %d %v threads=%d: %s", kern.Name, trial, g, threads, firstDiff(got, want))
				}
				if old != nil && !slices.Equal(bits32(got), bits32(old)) {
					t.Fatalf("%s: trial %d %v threads=%d: old backend: %s", kern.Name, trial, g, threads, firstDiff(got, old))
				}
			}
		}
	}
}

// BenchmarkDeterministicGemm compares the kernels with the old gonum
// backend and the fastest backend compiled in (OpenBLAS with -tags
// openblas), on a cube and on mlp32's products (width 512, batch 128 in 4
// micro-batches: forward, weight gradient, input gradient), with one thread
// and with all. On a shared machine the wall clock measures the others' load
// too: with one thread, GFLOP/s-cpu divides by the thread's CPU time.
func BenchmarkDeterministicGemm(b *testing.B) {
	type shape struct {
		name    string
		tA, tB  bool
		m, n, k int
		beta    float32
	}
	shapes := []shape{
		{"512x512x512", false, false, 512, 512, 512, 0},
		{"mlp32-fwd-32x512x512-tB", false, true, 32, 512, 512, 1},
		{"mlp32-dW-512x512x32-tA", true, false, 512, 512, 32, 1},
		{"mlp32-dX-32x512x512", false, false, 32, 512, 512, 0},
	}
	type backend struct {
		name string
		make func(threads int) Backend
	}
	backends := []backend{{"old-gonum", func(t int) Backend { return newGonumOracle(t) }}}
	for _, k := range sgemm.Kernels() {
		backends = append(backends, backend{"det-" + k.Name, func(t int) Backend { return &detGemm{threads: t, kern: k} }})
	}
	if best := Backends()[0]; best != detBackend {
		backends = append(backends, backend{best, func(t int) Backend { be, _ := NewBackend(best, t, false); return be }})
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range shapes {
		a, bm, c := make([]float32, s.m*s.k), make([]float32, s.k*s.n), make([]float32, s.m*s.n)
		for _, x := range [][]float32{a, bm, c} {
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
		}
		lda, ldb := s.k, s.n
		if s.tA {
			lda = s.m
		}
		if s.tB {
			ldb = s.k
		}
		flops := 2 * float64(s.m*s.n*s.k)
		for _, threads := range []int{1, runtime.GOMAXPROCS(0)} {
			for _, bk := range backends {
				be := bk.make(threads)
				b.Run(fmt.Sprintf("%s/%s/threads=%d", s.name, bk.name, threads), func(b *testing.B) {
					if threads == 1 {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
					}
					cpu0 := threadCPU()
					for b.Loop() {
						be.Sgemm(s.tA, s.tB, s.m, s.n, s.k, 1, a, lda, bm, ldb, s.beta, c, s.n)
					}
					b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					if cpu := threadCPU() - cpu0; threads == 1 && cpu > 0 {
						b.ReportMetric(flops*float64(b.N)/cpu.Seconds()/1e9, "GFLOP/s-cpu")
					}
				})
			}
		}
	}
}
