package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// Links with measured rates: three nodes in network namespaces
// whose links the test shapes. These are measurements, run with
// PPNODE_LINKS=1 (bench/links.sh); BENCHMARKS.md has their figures.

func requireLinkBench(t *testing.T) {
	t.Helper()
	if os.Getenv("PPNODE_LINKS") == "" {
		t.Skip("a throughput measurement on shaped links: set PPNODE_LINKS=1")
	}
}

// startShaped starts n one-thread nodes in namespaces, each link at
// rate bits/s (0: unshaped), and waits until a sees them all.
func startShaped(t *testing.T, n int, rate uint64) *Cluster {
	t.Helper()
	c := NewNetCluster(t)
	opts := make([]NodeOptions, n)
	for i := range opts {
		opts[i] = NodeOptions{Threads: 1}
	}
	c.StartAll(opts...)
	waitMembers(t, c.Node("a"), n)
	setAllRates(t, c, rate)
	return c
}

func setAllRates(t *testing.T, c *Cluster, rate uint64) {
	t.Helper()
	nodes := c.Nodes()
	for i := range nodes {
		for j := i + 1; j < len(nodes); j++ {
			if err := c.Network().SetRate(nodes[i].Name, nodes[j].Name, rate); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runJob submits spec to a and waits for its result.
func runJob(t *testing.T, c *Cluster, spec job.Spec) job.Status {
	t.Helper()
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	var st job.Status
	err = Poll("job "+rep.ID, 10*time.Minute, 50*time.Millisecond, func() (bool, error) {
		var err error
		st, err = c.Node("a").Job(rep.ID)
		return st.State.Ended(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone {
		t.Fatalf("job %s: %s %s", rep.ID, st.State, st.Error)
	}
	return st
}

// linkSpec is acceptance 4's job: mlp32 width 512 on MNIST, batch 128,
// SGD with momentum 0.9 (as bench/ddp_gloo.py).
func linkSpec(id string, steps int) job.Spec {
	spec := job.DefaultSpec()
	spec.ID = id
	spec.Model, spec.Width, spec.Data = "mlp32", 512, "mnist"
	spec.Batch, spec.MicroBatches, spec.Steps, spec.Epochs = 128, 4, steps, 10
	spec.Optimizer, spec.Threads = "sgd", 1
	spec.Partition, spec.CheckpointEvery = "auto", 1000
	return spec
}

// TestLinksRate: the same job on unshaped links and on 100 Mbit/s links,
// alternated, each on new nodes (which have not measured the links yet).
func TestLinksRate(t *testing.T) {
	requireLinkBench(t)
	for round := range 3 {
		for _, rate := range []uint64{0, 100e6} {
			t.Run(fmt.Sprintf("%d-%dMbit", round, rate/1e6), func(t *testing.T) {
				c := startShaped(t, 3, rate)
				st := runJob(t, c, linkSpec("rate", 600))
				r := st.Result
				t.Logf("links %4d Mbit/s: %.0f samples/s, step %.1f ms (predicted %.1f), steady overhead %.2f%%, plan %s",
					rate/1e6, r.SamplesPerSec, r.MeasuredStepMS, r.PredictedStepMS, 100*overhead(st), r.Plan)
				logLinks(t, st)
				logLinkLines(t, c.Node("a"))
			})
		}
	}
}

// logLinkLines logs what a node said about links and re-plans.
func logLinkLines(t *testing.T, n *Node) {
	t.Helper()
	for _, l := range strings.Split(n.stderr.tail(400), "\n") {
		if strings.Contains(l, "link") || strings.Contains(l, "re-plan") {
			t.Log("  " + n.Name + ": " + l)
		}
	}
}

// logLinks logs the job's link table.
func logLinks(t *testing.T, st job.Status) {
	t.Helper()
	t.Logf("  probes: %.0f ms at plan changes, %.0f ms between steps", st.ProbeMS, st.ProbeTrainMS)
	for _, l := range st.Links {
		line := fmt.Sprintf("  %s->%s %7.1f Mbit/s (%s, traffic bound %.0f) rtt %.2f ms, %.1f MB", l.From, l.To, l.MbitPerSec, l.Source, l.TrafficMbitPerSec, l.RTTMS, float64(l.WireBytes)/1e6)
		for _, k := range l.Kinds {
			line += fmt.Sprintf("; %s %s %.2fx encode %.0f ms sample %.1f ms", k.Kind, k.Codec, k.Ratio, k.EncodeMS, k.SampleMS)
		}
		t.Log(line)
	}
}

// ddp runs bench/ddp_gloo.py on one process per namespaced node, the links
// at rate bits/s (0: unshaped), and returns rank 0's samples per second.
func ddp(t *testing.T, nw *Network, names []string, rate uint64, steps int) float64 {
	t.Helper()
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if err := nw.SetRate(names[i], names[j], rate); err != nil {
				t.Fatal(err)
			}
		}
	}
	script, err := filepath.Abs("../bench/ddp_gloo.py")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	outs := make([]bytes.Buffer, len(names))
	var cmds []*exec.Cmd
	for r, n := range names {
		bin, args, err := nw.Command(n, "/usr/bin/python3", []string{script, "--rank", fmt.Sprint(r), "--world", fmt.Sprint(len(names)),
			"--master", Subnet + ".11:29500", "--steps", fmt.Sprint(steps)})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0")
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r].String())
		}
	}
	var res struct {
		SamplesPerSec float64 `json:"samples_per_sec"`
	}
	lines := strings.Split(strings.TrimSpace(outs[0].String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("rank 0 printed %q: %v", outs[0].String(), err)
	}
	return res.SamplesPerSec
}

// TestLinksDDP: PyTorch DDP (gloo) on the same namespaces, model, global
// batch and optimizer as TestLinksRate, unshaped and at 100 Mbit/s,
// alternated.
func TestLinksDDP(t *testing.T) {
	requireLinkBench(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 (Debian's python3-torch)")
	}
	nw := NewNetwork(t)
	names := []string{"a", "b", "c"}
	for _, n := range names {
		if _, err := nw.AddNode(n); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		for _, rate := range []uint64{0, 100e6} {
			steps := 40
			if rate != 0 {
				steps = 8
			}
			t.Logf("round %d: DDP, links %4d Mbit/s: %.1f samples/s", round, rate/1e6, ddp(t, nw, names, rate, steps))
		}
	}
}

// wireShare sums what the job's links carried of activations and
// gradients: raw and on the wire.
func wireShare(st job.Status) (raw, wire int64) {
	for _, l := range st.Links {
		for _, k := range l.Kinds {
			if k.Kind == "activation" || k.Kind == "gradient" {
				raw, wire = raw+k.RawBytes, wire+k.WireBytes
			}
		}
	}
	return raw, wire
}

// overhead is the share of the training time spent probing links between
// steps and choosing codecs (the senders' sampling, summed over links):
// the steady state's, without the probes at the job's start.
func overhead(st job.Status) float64 {
	ms := st.ProbeTrainMS
	for _, l := range st.Links {
		for _, k := range l.Kinds {
			ms += k.SampleMS
		}
	}
	return ms / (st.Result.Seconds * 1e3)
}

// TestLinksCodec (acceptance 1): every link at 100 Mbit/s, raw frames
// against the automatic codecs, alternated: mlp32 width 128 on three
// stages, the first away from the coordinator's node (the inputs cross a
// link; the planner alone would keep width 128 on one node) and width 512
// as planned; then a deterministic run with the automatic codecs gives
// --local's weights.
func TestLinksCodec(t *testing.T) {
	requireLinkBench(t)
	c := startShaped(t, 3, 100e6)
	for _, cfg := range []struct {
		width     float64
		partition string
	}{{128, "fc1-fc10@b; fc11-fc21@c; fc22-fc32@a"}, {512, "auto"}} {
		for round := range 2 {
			for _, wire := range []string{"raw", ""} {
				spec := linkSpec(fmt.Sprintf("codec-%v-%d-%s", cfg.width, round, wire), 200)
				spec.Width, spec.Partition, spec.Wire = cfg.width, cfg.partition, wire
				st := runJob(t, c, spec)
				r := st.Result
				raw, w := wireShare(st)
				t.Logf("width %4v %s wire %-5q: %.0f samples/s, step %.1f ms (predicted %.1f), activations+gradients %.2fx, steady overhead %.2f%%, start probes %.0f ms, plan %s",
					cfg.width, cfg.partition, wire, r.SamplesPerSec, r.MeasuredStepMS, r.PredictedStepMS, float64(raw)/float64(max(w, 1)), 100*overhead(st), st.ProbeMS, r.Plan)
				logLinks(t, st)
			}
		}
	}
	spec := linkSpec("codec-deterministic", 40)
	spec.Width, spec.Deterministic = 128, true
	st := runJob(t, c, spec)
	if want := localSHA(t, spec); st.Result.WeightsSHA256 != want {
		t.Errorf("deterministic on 100 Mbit/s links with automatic codecs: weights %s, --local %s", st.Result.WeightsSHA256, want)
	}
	logLinks(t, st)
}

// TestLinksSlowNode (acceptance 2): c behind 20 Mbit/s links, a-b at
// 1 Gbit/s; the link-blind plan (--no-probe) against the link-aware one,
// alternated; mlp32 width 1024 (PPNODE_LINKS_WIDTH sets another), batch 256.
func TestLinksSlowNode(t *testing.T) {
	requireLinkBench(t)
	c := startShaped(t, 3, 0)
	for _, l := range []struct {
		x, y string
		r    uint64
	}{{"a", "b", 1e9}, {"a", "c", 20e6}, {"b", "c", 20e6}} {
		if err := c.Network().SetRate(l.x, l.y, l.r); err != nil {
			t.Fatal(err)
		}
	}
	width := 1024.0
	if w, err := strconv.ParseFloat(os.Getenv("PPNODE_LINKS_WIDTH"), 64); err == nil {
		width = w
	}
	for round := range 2 {
		for _, blind := range []bool{true, false} {
			spec := linkSpec(fmt.Sprintf("slow-%d-%v", round, blind), 60)
			spec.Width, spec.Batch, spec.NoProbe = width, 256, blind
			st := runJob(t, c, spec)
			r := st.Result
			t.Logf("link-blind %-5v: %.0f samples/s, step %.1f ms, predicted %.1f ms (%+.0f%%), plan %s",
				blind, r.SamplesPerSec, r.MeasuredStepMS, r.PredictedStepMS, 100*(r.PredictedStepMS/r.MeasuredStepMS-1), r.Plan)
			logLinks(t, st)
		}
	}
}

// TestLinksCut (acceptance 3): every link at 1 Gbit/s; mid-job the link
// between the first two stages' nodes drops to 50 Mbit/s. The job
// re-plans within 30 steps; its throughput after the re-plan is compared
// with a fresh job's on the new links. mlp32 width 128: a link's bytes
// grow with the width and a step's compute with its square; at width 256
// the compressed tensors of a cut fitted in 50 Mbit/s beside the step's
// compute (6% slower, nothing to re-plan for), at 512 they hid entirely.
func TestLinksCut(t *testing.T) {
	requireLinkBench(t)
	c := startShaped(t, 3, 1e9)
	spec := linkSpec("cut", 1200)
	spec.Width = 128
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	sc := watchSteps(c.Node("a"), rep.ID)
	before := sc.waitStep(t, 60)
	nodes := stageNodes(before)
	if len(nodes) < 2 {
		t.Fatalf("plan %s has one stage", before.Plan)
	}
	if err := c.Network().SetRate(nodes[0], nodes[1], 50e6); err != nil {
		t.Fatal(err)
	}
	cut := sc.waitStep(t, 61).Step
	st := sc.wait(t)
	var first *job.Replan
	for i, r := range st.Replans {
		t.Logf("  re-plan at step %d (%s): %s; %s", r.Step, r.Trigger, r.Reason, r.Plan)
		if first == nil && r.Step >= cut {
			first = &st.Replans[i]
		}
	}
	logLinks(t, st)
	logLinkLines(t, c.Node("a"))
	replan := cut
	if first != nil {
		replan = first.Step
		t.Logf("link %s-%s at 50 Mbit/s from step %d; re-plan at step %d (%d steps later): %s", nodes[0], nodes[1], cut, first.Step, first.Step-cut, first.Plan)
	}
	after := sc.rate(replan+10, st.Total) * float64(spec.Batch)
	freshSpec := linkSpec("cut-fresh", 600)
	freshSpec.Width = spec.Width
	fresh := runJob(t, c, freshSpec).Result
	t.Logf("samples/s: before %.0f, slowed %.0f, after the re-plan %.0f; a fresh job on the new links %.0f (%s): %.2fx",
		sc.rate(10, cut)*float64(spec.Batch), sc.rate(cut+2, replan)*float64(spec.Batch), after, fresh.SamplesPerSec, fresh.Plan, after/fresh.SamplesPerSec)
	switch {
	case first == nil:
		t.Errorf("no re-plan after the link %s-%s dropped at step %d (plan %s)", nodes[0], nodes[1], cut, before.Plan)
	case first.Step-cut > 30:
		t.Errorf("re-planned %d steps after the link dropped, want at most 30", first.Step-cut)
	}
}

// TestLinksInt8 (acceptance 5): one epoch of mlp32 on MNIST as `ppnode
// train` runs it by default (Adam, cosine schedule) on three stages, lossless against
// --wire int8, three seeds each, alternated: test accuracy and bytes on
// the wire. (One seed says little: a perturbation of this deep a model's
// training moves its accuracy after an epoch by a point either way.)
func TestLinksInt8(t *testing.T) {
	requireLinkBench(t)
	c := startShaped(t, 3, 0)
	acc := map[string]float64{}
	for seed := 1; seed <= 3; seed++ {
		for _, wire := range []string{"", "int8"} {
			spec := job.DefaultSpec()
			spec.ID = fmt.Sprintf("int8-%d-%s", seed, wire)
			spec.Epochs, spec.Seed, spec.Wire, spec.Threads, spec.CheckpointEvery = 1, uint64(seed), wire, 1, 1000
			spec.Partition = "fc1-fc10@a; fc11-fc21@b; fc22-fc32@c" // every tensor crosses a link
			st := runJob(t, c, spec)
			raw, w := wireShare(st)
			acc[wire] += st.Result.TestAccuracy / 3
			t.Logf("seed %d wire %-5q: test accuracy %.4f, activations+gradients %d of %d raw bytes (%.3fx), %.0f samples/s, plan %s",
				seed, wire, st.Result.TestAccuracy, w, raw, float64(w)/float64(raw), st.Result.SamplesPerSec, st.Result.Plan)
		}
	}
	t.Logf("mean test accuracy: lossless %.4f, int8 %.4f (%+.2f points)", acc[""], acc["int8"], 100*(acc["int8"]-acc[""]))
}
