package dataplane_test

import (
	"io"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/nn"
)

// BenchmarkLoopback4MiBInterleaved is the side-by-side form of
// BenchmarkLoopback4MiB, for a machine whose speed drifts: each op sends 8
// tensors over raw dataplane.TCP, then 8 over the data plane, and the two are timed
// and charged CPU separately. It reports both goodputs, their ratio and
// both CPU costs, and the same for the protoactor remote path, which
// is why actors carry control only and tensors take the data plane.
func BenchmarkLoopback4MiBInterleaved(b *testing.B) {
	const burst = 8
	c, s := dataplane.RawTCPPair(b)
	out, in := make([]byte, 4*dataplane.BenchElems), make([]byte, 4*dataplane.BenchElems)
	for i := range out {
		out[i] = byte(i * 7)
	}
	snd, rcv := dataplane.Pair(b, &dataplane.TCP{}, dataplane.Options{})
	src, dst := nn.New(dataplane.BenchElems), nn.New(dataplane.BenchElems)
	for i := range nn.F32(src) {
		nn.F32(src)[i] = float32(i%1000) * 0.37
	}
	run := func(send, recv func() error) (secs, cpu float64) {
		errc := make(chan error, 1)
		cpu0, t0 := dataplane.CPUSeconds(), time.Now()
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
		return time.Since(t0).Seconds(), dataplane.CPUSeconds() - cpu0
	}
	// The protoactor path: a 4 MiB payload in a protobuf message from one
	// actor system to another over protoactor remote (gRPC), with message
	// and gRPC limits raised to let it through.
	got := make(chan struct{}, burst)
	sink := actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actors.SetupStage); ok {
			got <- struct{}{}
		}
	})
	big := actors.Config{MaxMessageBytes: 8 << 20, MaxGRPCBytes: 64 << 20, LogLevel: 12, // quiet: stopping the systems logs a lost connection
		Kinds: map[string]*actor.Props{"sink": sink}}
	recvSys, err := actors.Start(big)
	if err != nil {
		b.Fatal(err)
	}
	defer recvSys.Stop()
	sendSys, err := actors.Start(big)
	if err != nil {
		b.Fatal(err)
	}
	defer sendSys.Stop()
	sinkRef, err := sendSys.Spawn(recvSys.Address(), &actors.SpawnStage{Header: &actors.Header{JobId: "bench"}, Kind: "sink"}, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	payload := &actors.SetupStage{Header: &actors.Header{JobId: "bench"}, Spec: out}
	var rawS, rawC, dpS, dpC, paS, paC float64
	b.SetBytes(3 * burst * 4 * dataplane.BenchElems)
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
	gb := float64(b.N) * burst * 4 * dataplane.BenchElems / 1e9
	b.ReportMetric(gb/rawS, "raw-GB/s")
	b.ReportMetric(gb/dpS, "dp-GB/s")
	b.ReportMetric(rawS/dpS, "dp/raw")
	b.ReportMetric(rawC/gb, "raw-CPU-s/GB")
	b.ReportMetric(dpC/gb, "dp-CPU-s/GB")
	b.ReportMetric(gb/paS, "actor-GB/s")
	b.ReportMetric(paC/gb, "actor-CPU-s/GB")
}
