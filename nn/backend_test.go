package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// naiveGemm is the reference: float64 sums.
func naiveGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				ai, bi := i*lda+l, l*ldb+j
				if tA {
					ai = l*lda + i
				}
				if tB {
					bi = j*ldb + l
				}
				av, bv := a[ai], b[bi]
				s += float64(av) * float64(bv)
			}
			out[i*n+j] = float64(alpha)*s + float64(beta)*float64(c[i*ldc+j])
		}
	}
	return out
}

// Every compiled-in backend agrees with the float64 reference on random
// shapes and transpositions, and the deterministic one gives the same bits
// at every thread count.
func TestBackendsAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	trials := 60
	if testing.Short() { // the race pass: the parallel shapes and a few others
		trials = 12
	}
	for _, name := range nn.Backends() {
		for trial := 0; trial < trials; trial++ {
			m, n, k := 1+r.IntN(70), 1+r.IntN(300), 1+r.IntN(90)
			switch trial % 10 {
			case 0: // large enough to run in parallel, split by columns
				m, n, k = 130, 270, 200
			case 1: // split by rows
				m, n, k = 290, 120, 150
			}
			tA, tB := r.IntN(2) == 1, r.IntN(2) == 1
			alpha, beta := float32(r.NormFloat64()), []float32{0, 1, 0.5}[r.IntN(3)]
			lda, ldb := k, n
			if tA {
				lda = m
			}
			if tB {
				ldb = k
			}
			a := randSlice(r, m*k, 0.3)
			b := randSlice(r, k*n, 0)
			c0 := randSlice(r, m*n, 0)
			want := naiveGemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c0, n)
			var first []float32
			for _, threads := range []int{1, 2, 3} {
				be, err := nn.NewBackend(name, threads, false)
				if err != nil {
					t.Fatal(err)
				}
				c := slices.Clone(c0)
				be.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, n)
				for i := range c {
					if d := math.Abs(float64(c[i]) - want[i]); d > 1e-4*(1+math.Abs(want[i]))*math.Sqrt(float64(k)) {
						t.Fatalf("%s threads=%d %dx%dx%d tA=%v tB=%v: c[%d] = %v, want %v", name, threads, m, n, k, tA, tB, i, c[i], want[i])
					}
				}
				if first == nil {
					first = c
				} else if be.Deterministic() && !slices.Equal(bitsOf(first), bitsOf(c)) {
					t.Fatalf("%s: %d threads changed the bits", name, threads)
				}
			}
		}
	}
}

func bitsOf(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}

// randSlice draws normal values, a fraction of them zero (as after ReLU).
func randSlice(r *rand.Rand, n int, zeros float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		if r.Float64() >= zeros {
			s[i] = float32(r.NormFloat64())
		}
	}
	return s
}

func BenchmarkGemm(b *testing.B) {
	for _, name := range nn.Backends() {
		for _, sz := range [][3]int{{32, 512, 512}, {512, 512, 32}, {1024, 1024, 1024}} {
			be, _ := nn.NewBackend(name, 0, false)
			m, n, k := sz[0], sz[1], sz[2]
			x, y, z := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
			for i := range x {
				x[i] = 1
			}
			for i := range y {
				y[i] = 1
			}
			b.Run(name+"/"+dims(sz), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					be.Sgemm(false, false, m, n, k, 1, x, k, y, n, 0, z, n)
				}
				b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

func dims(s [3]int) string {
	return itoa(s[0]) + "x" + itoa(s[1]) + "x" + itoa(s[2])
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// NewBackend resolves names as documented, "gonum" (the deterministic
// backend's former name) included, and CheckBackend accepts exactly what
// NewBackend does.
func TestBackendNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		det  bool
		want string // "": refused
	}{
		{"", false, nn.Backends()[0]},
		{"", true, "ppnode-det"},
		{"ppnode-det", true, "ppnode-det"},
		{"ppnode-det", false, "ppnode-det"},
		{"gonum", true, "ppnode-det"},
		{"gonum", false, "ppnode-det"},
		{"ppnode", false, "ppnode"},
		{"ppnode", true, ""},
		{"no-such-backend", false, ""},
	} {
		be, err := nn.NewBackend(tc.name, 1, tc.det)
		if cerr := nn.CheckBackend(tc.name, tc.det); (cerr == nil) != (err == nil) {
			t.Errorf("%q deterministic=%v: CheckBackend says %v, NewBackend %v", tc.name, tc.det, cerr, err)
		}
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%q deterministic=%v: accepted as %s", tc.name, tc.det, be.Name())
		case tc.want != "" && err != nil:
			t.Errorf("%q deterministic=%v: %v", tc.name, tc.det, err)
		case err == nil && (be.Name() != tc.want || be.Deterministic() != (tc.want == "ppnode-det")):
			t.Errorf("%q deterministic=%v: got %s (deterministic %v), want %s", tc.name, tc.det, be.Name(), be.Deterministic(), tc.want)
		}
	}
}
