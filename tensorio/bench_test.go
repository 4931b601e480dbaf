package tensorio

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// benchTensors are 4 MiB tensors: ReLU activations (half zeros, the rest
// half-normal) and Gaussian gradients (no zeros).
func benchTensors() []struct {
	name string
	t    *nn.Tensor
} {
	r := rand.New(rand.NewPCG(21, 22))
	const n = 1 << 20
	return []struct {
		name string
		t    *nn.Tensor
	}{
		{"relu", randTensor(r, []int{256, n / 256}, fillReLU)},
		{"gauss", randTensor(r, []int{256, n / 256}, fillGauss)},
	}
}

// BenchmarkCodec reports, per data set and codec, encode and decode
// throughput of the []byte API (MB/s of raw float32 data) and the
// compression ratio (raw bytes / frame bytes).
func BenchmarkCodec(b *testing.B) {
	for _, d := range benchTensors() {
		raw := 4 * len(nn.F32(d.t))
		b.Run(fmt.Sprintf("data=%s/op=copy", d.name), func(b *testing.B) {
			dst := make([]float32, len(nn.F32(d.t)))
			b.SetBytes(int64(raw))
			for b.Loop() {
				copy(dst, nn.F32(d.t))
			}
		})
		for _, c := range Codecs() {
			frame, err := AppendFrame(nil, d.t, c)
			if err != nil {
				b.Fatal(err)
			}
			ratio := float64(raw) / float64(len(frame))
			b.Run(fmt.Sprintf("data=%s/codec=%s/op=encode", d.name, c), func(b *testing.B) {
				buf := make([]byte, 0, len(frame))
				b.SetBytes(int64(raw))
				for b.Loop() {
					buf, _ = AppendFrame(buf[:0], d.t, c)
				}
				b.ReportMetric(ratio, "ratio")
			})
			b.Run(fmt.Sprintf("data=%s/codec=%s/op=decode", d.name, c), func(b *testing.B) {
				dst := nn.New(d.t.Shape()...)
				b.SetBytes(int64(raw))
				for b.Loop() {
					if _, _, err := DecodeFrame(frame, dst); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(ratio, "ratio")
			})
		}
	}
}

// BenchmarkStreamRaw compares a raw frame through Writer and Reader with
// the plain copy of the same bytes into and out of a reused buffer: the
// framing overhead is the header and the two checksum passes (op=crc is
// one of them).
func BenchmarkStreamRaw(b *testing.B) {
	x := benchTensors()[1].t
	raw := f32View(nn.F32(x))
	var sink bytes.Buffer
	sink.Grow(len(raw) + 64)
	b.Run("op=copy", func(b *testing.B) {
		out := make([]byte, len(raw))
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			sink.Reset()
			sink.Write(raw)
			sink.Read(out)
		}
	})
	b.Run("op=frame", func(b *testing.B) {
		w := NewWriter(&sink, CodecRaw)
		r := NewReader(&sink)
		dst := nn.New(x.Shape()...)
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			sink.Reset()
			if err := w.WriteTensor(x); err != nil {
				b.Fatal(err)
			}
			if _, err := r.ReadTensor(dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("op=crc", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			crc(raw)
		}
	})
}

// BenchmarkSparseKernels compares the sparse kernels with and without the
// AVX-512 assembly on 1 MiB of ReLU-like data (half zeros).
func BenchmarkSparseKernels(b *testing.B) {
	r := rand.New(rand.NewPCG(25, 26))
	src := make([]float32, 1<<18)
	fillData(r, src, fillReLU)
	n := len(src)
	enc := make([]byte, sparseMaxLen(n))
	m := sparseEncode(enc, src)
	enc = enc[:m]
	bl := bitmapLen(n)
	bm, top, low := make([]byte, bl), make([]byte, n), make([]byte, 3*n+splitSlack)
	nnz := sparseSplit(bm, top, low, src)
	dst := make([]float32, n)
	modes := []bool{false}
	if hasSparseAVX {
		modes = append(modes, true)
	}
	defer func(old bool) { useSparseAVX = old }(useSparseAVX)
	for _, avx := range modes {
		useSparseAVX = avx
		ops := []struct {
			name string
			f    func()
		}{
			{"encode", func() { sparseEncode(enc[:cap(enc)], src) }},
			{"decode", func() { sparseDecode(dst, enc) }},
			{"split", func() { sparseSplit(bm, top, low, src) }},
			{"join", func() { sparseJoin(dst, bm, top[:nnz], low[:3*nnz]) }},
		}
		for _, op := range ops {
			b.Run(fmt.Sprintf("avx=%v/op=%s", avx, op.name), func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					op.f()
				}
			})
		}
	}
}
