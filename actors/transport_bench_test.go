package actors

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/dataplane"
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

// dataplanePair returns the two ends of a dataplane.TCP data-plane link.
func dataplanePair(t testing.TB) (snd, rcv dataplane.Link) {
	t.Helper()
	h := dataplane.Hello{JobID: "bench", Generation: 1, Link: 1, From: 0, To: 1}
	p := &dataplane.TCP{}
	ln, err := p.Listen(h, dataplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan dataplane.Link, 1)
	go func() { lk, _ := ln.Accept(); acc <- lk }()
	if snd, err = p.Dial(ln.Addr(), h, dataplane.Options{}); err != nil {
		t.Fatal(err)
	}
	if rcv = <-acc; rcv == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { snd.Close(); rcv.Close() })
	return snd, rcv
}

// BenchmarkLoopback4MiBInterleaved is the side-by-side form of
// BenchmarkLoopback4MiB, for a machine whose speed drifts: each op sends 8
// tensors over raw dataplane.TCP, then 8 over the data plane, and the two are timed
// and charged CPU separately. It reports both goodputs, their ratio and
// both CPU costs, and the same for the protoactor remote path, which
// carries control only (DESIGN.md).
func BenchmarkLoopback4MiBInterleaved(b *testing.B) {
	const burst = 8
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := <-acc
	defer s.Close()
	out, in := make([]byte, 4*benchElems), make([]byte, 4*benchElems)
	for i := range out {
		out[i] = byte(i * 7)
	}
	snd, rcv := dataplanePair(b)
	src, dst := nn.New(benchElems), nn.New(benchElems)
	for i := range nn.F32(src) {
		nn.F32(src)[i] = float32(i%1000) * 0.37
	}
	run := func(send, recv func() error) (secs, cpu float64) {
		errc := make(chan error, 1)
		cpu0, t0 := cpuSeconds(), time.Now()
		go func() {
			for range burst {
				if err := recv(); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for range burst {
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		return time.Since(t0).Seconds(), cpuSeconds() - cpu0
	}
	// The protoactor path: a 4 MiB payload in a protobuf message from one
	// actor system to another over protoactor remote (gRPC), with message
	// and gRPC limits raised to let it through.
	got := make(chan struct{}, burst)
	big := Config{MaxMessageBytes: 8 << 20, MaxGRPCBytes: 64 << 20, LogLevel: 12} // quiet: stopping the systems logs a lost connection
	recvSys, err := Start(big)
	if err != nil {
		b.Fatal(err)
	}
	defer recvSys.Stop()
	sendSys, err := Start(big)
	if err != nil {
		b.Fatal(err)
	}
	defer sendSys.Stop()
	sink, err := recvSys.as.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*SetupStage); ok {
			got <- struct{}{}
		}
	}), "sink")
	if err != nil {
		b.Fatal(err)
	}
	sinkRef := StageRef{Addr: recvSys.Address(), ID: sink.GetId()}
	payload := &SetupStage{Header: &Header{JobId: "bench"}, Spec: out}
	var rawS, rawC, dpS, dpC, paS, paC float64
	b.SetBytes(3 * burst * 4 * benchElems)
	b.ResetTimer()
	for range b.N {
		t, u := run(func() error { _, err := c.Write(out); return err },
			func() error { _, err := io.ReadFull(s, in); return err })
		rawS, rawC = rawS+t, rawC+u
		t, u = run(func() error { return snd.Send(dataplane.Tag{Kind: dataplane.KindActivation}, src) },
			func() error { _, _, err := rcv.Recv(dst); return err })
		dpS, dpC = dpS+t, dpC+u
		t, u = run(func() error { return sendSys.Send(sinkRef, payload) },
			func() error { <-got; return nil })
		paS, paC = paS+t, paC+u
	}
	gb := float64(b.N) * burst * 4 * benchElems / 1e9
	b.ReportMetric(gb/rawS, "raw-GB/s")
	b.ReportMetric(gb/dpS, "dp-GB/s")
	b.ReportMetric(rawS/dpS, "dp/raw")
	b.ReportMetric(rawC/gb, "raw-CPU-s/GB")
	b.ReportMetric(dpC/gb, "dp-CPU-s/GB")
	b.ReportMetric(gb/paS, "actor-GB/s")
	b.ReportMetric(paC/gb, "actor-CPU-s/GB")
}
