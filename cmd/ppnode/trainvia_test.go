package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// train --via follows a job to the node that takes it over when the
// coordinator's node dies, says so, and prints the fault-free result.
func TestTrainViaFollowsTakeover(t *testing.T) {
	var as []*nodes.Agent
	for i := range 3 {
		cfg := nodes.Config{Name: string(rune('a' + i)), Bind: "127.0.0.1:0", Threads: 1, ProfileFor: 20 * time.Millisecond,
			DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), ActorLogLevel: slog.LevelError}
		if i > 0 {
			cfg.Seeds = []string{as[0].GossipAddr()}
		}
		a, err := nodes.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		as = append(as, a)
	}
	args := []string{"--deterministic", "--model", "mlp32", "--width", "16", "--data", "synthetic:8x8x1:4",
		"--synthetic-samples", "96", "--batch", "24", "--micro-batches", "4", "--epochs", "100", "--steps", "300", "--threads", "1"}
	local := trainJSON(t, args...)

	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(append([]string{"train", "--json", "--via", as[0].HTTPAddr(), "--partition", "uniform",
			"--checkpoint-every", "10", "--replicas", "2"}, args...), &out, &errb)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		if js := as[0].Jobs(); len(js) == 1 && js[0].LatestCut >= 20 {
			if js[0].State != job.StateTraining || js[0].Holders[0] != "b" {
				t.Fatalf("job before the kill: %+v", js[0])
			}
			break
		}
		select {
		case code := <-done:
			t.Fatalf("train --via ended (exit %d) before the coordinator died: %s", code, errb.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no durable cut within a minute")
		}
	}
	if err := as[0].Close(); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("train --via still runs 3 minutes after the kill")
	}
	if code != 0 {
		t.Fatalf("train --via: exit %d: %s", code, errb.String())
	}
	t.Logf("client's stderr:\n%s", errb.String())
	if !strings.Contains(errb.String(), "coordinator a lost; job taken over by b from step ") {
		t.Errorf("the takeover is not shown:\n%s", errb.String())
	}
	var res job.Result
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if res.WeightsSHA256 != local.WeightsSHA256 || res.Steps != 300 {
		t.Fatalf("after the takeover: weights %s, %d steps; without it %s", res.WeightsSHA256, res.Steps, local.WeightsSHA256)
	}
}

func TestReplicasFlag(t *testing.T) {
	for _, n := range []string{"0", "9"} {
		var out, errb bytes.Buffer
		if code := run([]string{"train", "--via", "127.0.0.1:1", "--replicas", n}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--replicas") {
			t.Errorf("--replicas %s: exit %d, stderr %q; want a usage error", n, code, errb.String())
		}
	}
}
