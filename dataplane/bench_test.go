package dataplane

import (
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
)

// cpuSeconds is the user + system CPU time of the whole process (both ends
// of the loopback connection run in it).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

const benchElems = 1 << 20 // 4 MiB of float32

// measure runs send and recv, b.N times each, in two goroutines and reports
// goodput and CPU per GB.
func measure(b *testing.B, send, recv func() error) {
	b.SetBytes(4 * benchElems)
	errc := make(chan error, 1)
	cpu0, t0 := cpuSeconds(), time.Now()
	b.ResetTimer()
	go func() {
		for range b.N {
			if err := recv(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range b.N {
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	secs, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	gb := float64(b.N) * 4 * benchElems / 1e9
	b.ReportMetric(gb/secs, "GB/s")
	b.ReportMetric(cpu/gb, "CPU-s/GB")
}

// rawTCPPair returns both ends of a TCP connection on 127.0.0.1, closed
// when the test ends.
func rawTCPPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	if client, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		tb.Fatal(err)
	}
	if server = <-acc; server == nil {
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// BenchmarkLoopback4MiB compares, on 127.0.0.1, the data plane (raw codec,
// tag + tensorio frame with checksum, into a reused tensor) with raw TCP
// into a reused buffer: the frames' checksums and codecs must cost little
// next to the transfer.
func BenchmarkLoopback4MiB(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	src := nn.New(benchElems)
	for i := range nn.F32(src) {
		nn.F32(src)[i] = float32(r.NormFloat64())
	}
	b.Run("raw-tcp", func(b *testing.B) {
		c, s := rawTCPPair(b)
		out := make([]byte, 4*benchElems)
		for i := range out {
			out[i] = byte(i * 7)
		}
		in := make([]byte, len(out))
		measure(b,
			func() error { _, err := c.Write(out); return err },
			func() error { _, err := io.ReadFull(s, in); return err })
	})
	b.Run("dataplane", func(b *testing.B) {
		snd, rcv := pair(b, &TCP{}, Options{})
		dst := nn.New(benchElems)
		var mb uint32
		measure(b,
			func() error { mb++; return snd.Send(Tag{MicroBatch: mb, Kind: KindActivation}, src) },
			func() error { _, _, err := rcv.Recv(dst); return err })
	})
}

// BenchmarkProtected4MiB measures what protecting the links costs on
// 127.0.0.1 with raw 4 MiB float32 tensors: each op sends a burst of 8
// over a plain link (A), then over one authenticated with the cluster key
// (B), then over one encrypted with mutual TLS 1.3 and the key (C), each
// timed and charged CPU (user + system, both ends) separately, so the
// modes alternate A B C A B C on a machine whose speed drifts. It reports
// each mode's median goodput over the ops (MB/s), its ratio to plain's and
// its median CPU-seconds per GB.
func BenchmarkProtected4MiB(b *testing.B) {
	const burst = 8
	k := newPKI(b)
	modes := []struct {
		name string
		p    *TCP
	}{
		{"plain", &TCP{}},
		{"key", &TCP{Key: testKey}},
		{"tls", &TCP{Key: testKey, ServerTLS: k.server(), ClientTLS: k.client()}},
	}
	src := nn.New(benchElems)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range nn.F32(src) {
		nn.F32(src)[i] = float32(r.NormFloat64())
	}
	snd, rcv, dst := make([]Link, len(modes)), make([]Link, len(modes)), make([]*nn.Tensor, len(modes))
	for i, m := range modes {
		snd[i], rcv[i] = pair(b, m.p, Options{}) // the raw codec
		dst[i] = nn.New(benchElems)
	}
	mbs, cpus := make([][]float64, len(modes)), make([][]float64, len(modes))
	const gb = burst * 4 * benchElems / 1e9
	b.ResetTimer()
	for range b.N {
		for i := range modes {
			secs, cpu := sendBurst(b, snd[i], rcv[i], src, dst[i], burst)
			mbs[i] = append(mbs[i], gb*1e3/secs)
			cpus[i] = append(cpus[i], cpu/gb)
		}
	}
	b.StopTimer()
	plain := median(mbs[0])
	for i, m := range modes {
		b.ReportMetric(median(mbs[i]), m.name+"-MB/s")
		b.ReportMetric(median(cpus[i]), m.name+"-CPU-s/GB")
		if i > 0 {
			b.ReportMetric(median(mbs[i])/plain, m.name+"/plain")
		}
	}
}

// sendBurst sends n tensors from snd to rcv and returns the seconds and
// the process's CPU-seconds that took.
func sendBurst(b *testing.B, snd, rcv Link, src, dst *nn.Tensor, n int) (secs, cpu float64) {
	errc := make(chan error, 1)
	cpu0, t0 := cpuSeconds(), time.Now()
	go func() {
		for range n {
			if _, _, err := rcv.Recv(dst); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range n {
		if err := snd.Send(Tag{MicroBatch: uint32(i), Kind: KindActivation}, src); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return time.Since(t0).Seconds(), cpuSeconds() - cpu0
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
