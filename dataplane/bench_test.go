package dataplane

import (
	"io"
	"math/rand/v2"
	"net"
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
// into a reused buffer (acceptance 3 of issue 5).
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
