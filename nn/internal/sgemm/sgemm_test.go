package sgemm

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// Every kernel computes the tiles of the Go kernel, bit for bit, whatever
// its strides and flags, and gives up on the same tiles; PackT gives the
// same panels.
func TestKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var kernels []*Kernel
	for _, k := range Kernels() {
		kernels = append(kernels, k)
		if n := k.Narrow; n != nil {
			if n.MR != k.MR || n.NR != k.NR/2 || n.Strided != k.Strided {
				t.Fatalf("%s: its narrow kernel is %d×%d strided=%v", k.Name, n.MR, n.NR, n.Strided)
			}
			kernels = append(kernels, n)
		}
	}
	for _, k := range kernels {
		ref := &Kernel{Name: "go", MR: k.MR, NR: k.NR, Tile: tileGo(k.MR, k.NR), PackT: packTGo(k.NR)}
		for trial := range 400 {
			kc := r.IntN(40)
			pl, pr := k.MR, 1
			if trial%2 == 1 && k.Strided {
				pl, pr = 1, kc+r.IntN(5)
			}
			p := randFloats(r, max(1, (kc-1)*pl+(k.MR-1)*pr+1), 0.3)
			ql := k.NR
			if trial%3 != 0 {
				ql += r.IntN(40)
			}
			q := randFloats(r, max(1, (kc-1)*ql+k.NR), 0.1)
			ldc := k.NR + r.IntN(5)
			c := randFloats(r, (k.MR-1)*ldc+k.NR, 0.1)
			if trial%5 == 0 {
				c[r.IntN(len(c))] = float32(math.Copysign(0, -1))
			}
			if trial%7 == 0 {
				c[r.IntN(len(c))] = math.Float32frombits(0x7f800001)
			}
			if trial%11 == 0 {
				p[r.IntN(len(p))] = float32(math.NaN())
			}
			if trial%13 == 0 {
				q[r.IntN(len(q))] = float32(math.Inf(1 - 2*r.IntN(2)))
			}
			if trial%17 == 0 {
				c[r.IntN(len(c))] = float32(math.Inf(1))
			}
			flags, beta := r.IntN(4), float32(r.NormFloat64())
			got, want := slices.Clone(c), slices.Clone(c)
			sg := k.Tile(kc, &p[0], pl, pr, &q[0], ql, &got[0], ldc, beta, flags)
			sw := ref.Tile(kc, &p[0], pl, pr, &q[0], ql, &want[0], ldc, beta, flags)
			if sg != sw || !slices.Equal(bits(got), bits(want)) {
				t.Fatalf("%s trial %d kc=%d flags=%d: special %v, want %v; tiles equal: %v", k.Name, trial, kc, flags, sg, sw, slices.Equal(bits(got), bits(want)))
			}
			if sg && !slices.Equal(bits(got), bits(c)) {
				t.Fatalf("%s trial %d: a special tile was written", k.Name, trial)
			}

			lds := kc + r.IntN(9)
			src := randFloats(r, (k.NR-1)*lds+kc, 0)
			d1, d2 := make([]float32, kc*k.NR), make([]float32, kc*k.NR)
			if kc > 0 {
				k.PackT(kc, src, lds, d1)
				ref.PackT(kc, src, lds, d2)
			}
			if !slices.Equal(bits(d1), bits(d2)) {
				t.Fatalf("%s packT trial %d kc=%d", k.Name, trial, kc)
			}
		}
	}
}

func randFloats(r *rand.Rand, n int, zeros float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		if r.Float64() >= zeros {
			s[i] = float32(r.NormFloat64())
		}
	}
	return s
}

func bits(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}

// BenchmarkTile runs each kernel on a panel in the L1 cache: its peak.
// GFLOP/s-cpu divides by the thread's CPU time (the machine may be shared).
func BenchmarkTile(b *testing.B) {
	const kc = 128
	for _, k := range Kernels() {
		p := make([]float32, kc*k.MR)
		q := make([]float32, kc*k.NR)
		c := make([]float32, k.MR*k.NR)
		for i := range q {
			q[i] = 1
		}
		b.Run(k.Name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU()
			for b.Loop() {
				k.Tile(kc, &p[0], k.MR, 1, &q[0], k.NR, &c[0], k.NR, 1, Load)
			}
			flops := 2 * float64(kc*k.MR*k.NR) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			if cpu := threadCPU() - cpu0; cpu > 0 {
				b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/s-cpu")
			}
		})
	}
}
