package nodes

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape returns the body of GET url.
func scrape(t *testing.T, url string) []byte {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET %s: %d %q: %s", url, res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	return b
}

// parseMetrics parses a body in the text format strictly (a family's
// samples apart, a bad escape, a sample without its TYPE are errors).
func parseMetrics(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the body does not parse: %v\n%s", err, body)
	}
	for name, f := range fams {
		if f.GetHelp() == "" || f.Type == nil {
			t.Errorf("%s has no HELP or TYPE", name)
		}
	}
	return fams
}

// promtoolCheck runs `promtool check metrics` (Debian's prometheus
// package) on body; it skips t without promtool.
func promtoolCheck(t *testing.T, body []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: `apt-get install prometheus` (Debian) to check /metrics with it; skipping")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s\nbody:\n%s", err, out, body)
	}
}

// series are the samples of a family by their labels, written as
// name=value pairs sorted by name and joined by commas (le included).
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no family %s", name)
	}
	out := map[string]float64{}
	for _, m := range f.Metric {
		var ls []string
		for _, l := range m.Label {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		slices.Sort(ls)
		var v float64
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Histogram != nil:
			v = float64(m.Histogram.GetSampleCount())
		}
		out[strings.Join(ls, ",")] = v
	}
	return out
}

// histogramOf returns the histogram of a family with the given labels.
func histogramOf(t *testing.T, fams map[string]*dto.MetricFamily, name, labels string) *dto.Histogram {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		var ls []string
		for _, l := range m.Label {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		slices.Sort(ls)
		if strings.Join(ls, ",") == labels {
			return m.Histogram
		}
	}
	t.Fatalf("no %s{%s}", name, labels)
	return nil
}

// The text format's escaping, HELP and TYPE lines and histograms, on a
// node and job whose names need escaping.
func TestMetricsFormat(t *testing.T) {
	odd := "n\"ode\\ 1\nx" // a quote, a backslash and a line feed
	js := job.Status{ID: "j-1", State: job.StateTraining, Step: 7, Total: 10, SamplesPerSec: 123.5, Loss: math.NaN(), Cuts: 1,
		Recoveries: []job.Recovery{{Step: 7, Replayed: 2}},
		Replans:    []job.Replan{{Trigger: job.TriggerRequested}, {Trigger: "future"}},
		Links:      []job.LinkStatus{{From: odd, To: "b", Kinds: []job.LinkKind{{Kind: "activation", Frames: 4, WireBytes: 1000}}}}}
	st := Status{Version: "v1.2.3", Members: []MemberStatus{{Name: odd, State: MemberAlive}, {Name: "b", State: MemberFailed}},
		Jobs: []JobStatus{{Status: js}}}
	m := actors.JobMeter{
		Steps:  actors.Histogram{Bounds: []float64{0.1, 1}, Counts: []uint64{2, 5, 2}, Count: 9, Sum: 4500 * time.Millisecond},
		Stages: []actors.StageMeter{{Stage: 0, Node: odd, Steps: 9, Forward: time.Second, Wait: 250 * time.Millisecond}},
	}
	var e exposition
	conns := []portConns{{"actor", admit.Stats{Accepted: 5, RefusedPerIP: 20000, TimedOut: 3, InHandshake: 2, Held: 4}, 7}, {"http", admit.Stats{RefusedConns: 1}, 0}}
	writeMetrics(&e, st, []jobMeter{{st: st.Jobs[0], m: m}}, []dataplane.PeerTraffic{{Peer: "::1", SentBytes: 10, SentFrames: 1}}, conns)
	body := e.b.Bytes()
	fams := parseMetrics(t, body)

	if got := series(t, fams, "ppnode_build_info"); got["goversion="+runtime.Version()+",revision="+buildRevision+",version=v1.2.3"] != 1 {
		t.Errorf("build info %v", got)
	}
	wantMembers := map[string]float64{"state=alive": 1, "state=leaving": 0, "state=left": 0, "state=failed": 1}
	if got := series(t, fams, "ppnode_cluster_members"); !mapsEqual(got, wantMembers) {
		t.Errorf("members %v, want %v", got, wantMembers)
	}
	wantRefused := map[string]float64{"limit=per_ip,port=actor": 20000, "limit=handshakes,port=actor": 0, "limit=conns,port=actor": 0,
		"limit=per_ip,port=http": 0, "limit=handshakes,port=http": 0, "limit=conns,port=http": 1}
	if got := series(t, fams, "ppnode_conns_refused_total"); !mapsEqual(got, wantRefused) {
		t.Errorf("refused connections %v, want %v", got, wantRefused)
	}
	if got := series(t, fams, "ppnode_actor_refused_total"); got[""] != 7 {
		t.Errorf("refused by role %v, want 7", got)
	}
	wantConns := map[string]float64{"port=actor,state=handshake": 2, "port=actor,state=established": 2, "port=http,state=handshake": 0, "port=http,state=established": 0}
	if got := series(t, fams, "ppnode_conns"); !mapsEqual(got, wantConns) {
		t.Errorf("connections %v, want %v", got, wantConns)
	}
	if got := series(t, fams, "ppnode_conns_handshake_timeouts_total"); got["port=actor"] != 3 {
		t.Errorf("handshake timeouts %v", got)
	}
	if got := series(t, fams, "ppnode_job_stage_busy_seconds_total"); got["job=j-1,node="+odd+",phase=forward,stage=0"] != 1 {
		t.Errorf("stage busy %v: the node's name should come back as it was", got)
	}
	if got := series(t, fams, "ppnode_job_link_sent_bytes_total"); got["from="+odd+",job=j-1,kind=activation,to=b"] != 1000 {
		t.Errorf("link bytes %v", got)
	}
	if got := series(t, fams, "ppnode_job_replans_total"); got["job=j-1,trigger=requested"] != 1 || got["job=j-1,trigger=future"] != 1 || got["job=j-1,trigger=speeds"] != 0 {
		t.Errorf("replans %v", got)
	}
	if got := series(t, fams, "ppnode_job_state"); got["job=j-1,state=training"] != 1 || got["job=j-1,state=done"] != 0 {
		t.Errorf("state %v", got)
	}
	if got := series(t, fams, "ppnode_job_train_loss")["job=j-1"]; !math.IsNaN(got) {
		t.Errorf("loss %v, want NaN", got)
	}
	h := histogramOf(t, fams, "ppnode_job_step_seconds", "job=j-1")
	var cum []uint64
	for _, b := range h.Bucket {
		cum = append(cum, b.GetCumulativeCount())
	}
	if !slices.Equal(cum, []uint64{2, 7, 9}) || h.GetSampleCount() != 9 || h.GetSampleSum() != 4.5 {
		t.Errorf("step histogram %v", h)
	}
	t.Run("promtool", func(t *testing.T) { promtoolCheck(t, body) })
}

func mapsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// awaitJob waits until the status of the job c runs satisfies ok,
// re-checking at every change, and fails the test after d or if the job
// ends first.
func awaitJob(t *testing.T, c *actors.Coordinator, d time.Duration, what string, ok func(job.Status) bool) job.Status {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		changed := c.Changed()
		st := c.Status()
		if ok(st) {
			return st
		}
		if st.State.Ended() {
			t.Fatalf("waiting for %s: the job ended %s at step %d: %s", what, st.State, st.Step, st.Error)
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waiting %v for %s: the job is %s at step %d", d, what, st.State, st.Step)
		}
	}
}

// /metrics of a node that coordinates a job through a recovery and a
// re-plan passes promtool, and its counters agree with the node's status:
// steps, recoveries, re-plans, cuts, links, members.
func TestMetricsAgreeWithStatus(t *testing.T) {
	a := start(t, "a")
	b := start(t, "b", a.GossipAddr())
	c := start(t, `c"3\`, a.GossipAddr()) // a name the labels escape
	for _, n := range []*Agent{a, b, c} {
		awaitMembers(t, n, 5*time.Second, "all members", func(ms []cluster.Member) bool { return len(ms) == 3 })
	}
	spec := smallSpec()
	spec.ID = "metrics"
	spec.Steps, spec.Epochs = 0, 2000 // 8000 steps: it is cancelled long before
	spec.CheckpointEvery = 5
	spec.Partition, spec.Schedule = "uniform", "1f1b"
	co, err := a.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	st := awaitJob(t, co, time.Minute, "a cut at step 5", func(s job.Status) bool { return s.LatestCut >= 5 })
	t.Logf("closing %s at step %d", c.Name(), st.Step)
	if err := c.Close(); err != nil { // its stage fails: the job recovers
		t.Fatal(err)
	}
	st = awaitJob(t, co, time.Minute, "a recovery and 3 steps", func(s job.Status) bool {
		return len(s.Recoveries) > 0 && s.State == job.StateTraining && s.Step >= s.Recoveries[0].Step+3
	})
	t.Logf("recovered: %s", st.Plan)
	if err := a.Replan(spec.ID, ReplanRequest{Partition: "fc1-fc3@b; fc4-fc32@a"}); err != nil {
		t.Fatal(err)
	}
	st = awaitJob(t, co, time.Minute, "a re-plan and 3 steps", func(s job.Status) bool {
		return len(s.Replans) > 0 && s.State == job.StateTraining && s.Step >= s.Replans[len(s.Replans)-1].Step+3
	})
	t.Logf("re-planned: %s", st.Plan)
	if err := a.Cancel(spec.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := a.Wait(ctx, spec.ID); err != nil {
		var dump strings.Builder
		pprof.Lookup("goroutine").WriteTo(&dump, 1)
		t.Fatalf("the cancelled job did not end: %v; %s\n%s", err, co.Status().State, dump.String())
	}

	// The members may change under a scrape (c's failure spreading):
	// scrape until the status before and after agree.
	var status Status
	var body []byte
	for range 10 {
		status = a.Status()
		body = scrape(t, "http://"+a.HTTPAddr()+"/metrics")
		if after := a.Status(); describeMembers(after) == describeMembers(status) {
			break
		}
	}
	t.Run("promtool", func(t *testing.T) { promtoolCheck(t, body) })

	fams := parseMetrics(t, body)
	if len(status.Jobs) != 1 {
		t.Fatalf("status jobs %+v", status.Jobs)
	}
	js := status.Jobs[0].Status
	lj := "job=" + js.ID
	value := func(name, labels string) float64 {
		t.Helper()
		v, ok := series(t, fams, name)[labels]
		if !ok {
			t.Fatalf("no %s{%s}", name, labels)
		}
		return v
	}
	check := func(what string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: /metrics %v, status %v", what, got, want)
		}
	}

	byState := map[MemberState]float64{}
	for _, m := range status.Members {
		byState[m.State]++
	}
	for _, s := range []MemberState{MemberAlive, MemberLeaving, MemberLeft, MemberFailed} {
		check("members "+string(s), value("ppnode_cluster_members", "state="+string(s)), byState[s])
	}
	check("build version", value("ppnode_build_info", "goversion="+runtime.Version()+",revision="+buildRevision+",version="+status.Version), 1)
	for _, s := range jobStates {
		check("state "+string(s), value("ppnode_job_state", lj+",state="+string(s)), b2f(js.State == s))
	}

	replayed := 0
	for _, r := range js.Recoveries {
		replayed += r.Replayed
	}
	check("steps done", value("ppnode_job_steps_done", lj), float64(js.Step))
	check("steps planned", value("ppnode_job_steps_planned", lj), float64(js.Total))
	// A recovery's Replayed counts the steps from the cut to the failure;
	// a step in flight when the failure or the cancel came is counted by
	// one side only, so steps run lie between done and done + replayed.
	if run := value("ppnode_job_steps_total", lj); run < float64(js.Step) || run > float64(js.Step+replayed) {
		t.Errorf("steps completed: /metrics %v, status %d done and %d replayed", run, js.Step, replayed)
	}
	check("step histogram count", value("ppnode_job_step_seconds", lj), value("ppnode_job_steps_total", lj))
	check("samples/s", value("ppnode_job_samples_per_second", lj), js.SamplesPerSec)
	check("recoveries", value("ppnode_job_recoveries_total", lj), float64(len(js.Recoveries)))
	check("replayed steps", value("ppnode_job_replayed_steps_total", lj), float64(replayed))
	check("cuts", value("ppnode_job_cuts_total", lj), float64(js.Cuts))
	replans := map[string]float64{}
	for _, r := range js.Replans {
		replans[lj+",trigger="+string(r.Trigger)]++
	}
	var total float64
	for labels, v := range series(t, fams, "ppnode_job_replans_total") {
		check("re-plans "+labels, v, replans[labels])
		total += v
	}
	check("re-plans", total, float64(len(js.Replans)))
	if replans[lj+",trigger=requested"] == 0 {
		t.Errorf("re-plans %+v: none requested", js.Replans)
	}
	if got := value("ppnode_job_cut_pause_seconds", lj); got < float64(js.Cuts) || js.Cuts == 0 {
		t.Errorf("%v cuts gathered, %d consistent cuts", got, js.Cuts)
	}
	steps := histogramOf(t, fams, "ppnode_job_step_seconds", lj)
	if steps.GetSampleSum() <= 0 {
		t.Errorf("steps took %v s in all", steps.GetSampleSum())
	}

	// Every stage's node computed, the closed one too (under its name).
	busy := map[string]float64{}
	for labels, v := range series(t, fams, "ppnode_job_stage_busy_seconds_total") {
		for _, l := range strings.Split(labels, ",") {
			if n, ok := strings.CutPrefix(l, "node="); ok {
				busy[n] += v
			}
		}
	}
	for _, n := range []string{"a", "b", c.Name()} {
		if busy[n] <= 0 {
			t.Errorf("stages on %q busy %v s; by node %v", n, busy[n], busy)
		}
	}

	// The links the job counted, and a's data plane, which sent at least
	// what the job's stages and feeds on a sent to other nodes.
	var fromA, framesFromA float64
	for _, l := range js.Links {
		for _, k := range l.Kinds {
			labels := fmt.Sprintf("from=%s,%s,kind=%s,to=%s", l.From, lj, k.Kind, l.To)
			check("link bytes "+labels, value("ppnode_job_link_sent_bytes_total", labels), float64(k.WireBytes))
			check("link frames "+labels, value("ppnode_job_link_sent_frames_total", labels), float64(k.Frames))
			if l.From == "a" {
				fromA += float64(k.WireBytes)
				framesFromA += float64(k.Frames)
			}
		}
	}
	if fromA == 0 {
		t.Errorf("no traffic from a in the job's links %+v", js.Links)
	}
	sum := func(name string) float64 {
		var n float64
		for _, v := range series(t, fams, name) {
			n += v
		}
		return n
	}
	if got := sum("ppnode_dataplane_sent_bytes_total"); got < fromA {
		t.Errorf("a's data plane sent %v bytes; the job counts %v from a", got, fromA)
	}
	if got := sum("ppnode_dataplane_sent_frames_total"); got < framesFromA {
		t.Errorf("a's data plane sent %v frames; the job counts %v from a", got, framesFromA)
	}
	if sum("ppnode_dataplane_received_bytes_total") == 0 || sum("ppnode_dataplane_received_frames_total") == 0 {
		t.Errorf("a's data plane received nothing")
	}

	// The same access as GET /v1/status: a Host that is not the node's is
	// refused.
	req, _ := http.NewRequest("GET", "http://"+a.HTTPAddr()+"/metrics", nil)
	req.Host = "attacker.example"
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("GET /metrics with a foreign Host: %d, want 403", res.StatusCode)
	}
}

// describeMembers describes the members of st by name and state.
func describeMembers(st Status) string {
	var out []string
	for _, m := range st.Members {
		out = append(out, m.Name+"="+string(m.State))
	}
	return strings.Join(out, ",")
}
