package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// The dashboard (GET / of every node) in a real headless Chromium
// (Debian's chromium package; the tests skip without it). Screenshots go
// to the directory PPNODE_SCREENSHOTS names, if set:
//
//	PPNODE_SCREENSHOTS=/tmp/dash go test -count=1 -run TestDashboard -v ./integration/
//
// The CPU the dashboard costs a node is a measurement, run with
// PPNODE_DASHBOARD_CPU=1 (TestDashboardCPU).

// browser is a headless Chromium tab that records the errors the page
// logs: uncaught exceptions, console.error and the browser's own error
// entries (a failed request, a refused inline style).
type browser struct {
	ctx context.Context

	mu   sync.Mutex // guards errs
	errs []string
}

// chromiumPath is the browser the tests drive, or "".
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts Chromium for the test (it is stopped at its end), or
// skips the test if there is none.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("no chromium on PATH: the dashboard tests drive a real browser (Debian: apt-get install -y chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(1400, 1000),
		// The nodes' certificates are signed by the test cluster's CA.
		chromedp.IgnoreCertErrors)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	messages := chromedp.Console(ctx) // starts the browser
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				b.mu.Lock()
				b.errs = append(b.errs, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line+1))
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		chromedp.Cancel(ctx) // closes the browser
		cancelTab()
		cancelAlloc() // and waits for its process
		<-done
	})
	return b
}

// errors are the errors the page logged so far.
func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// do runs actions on the tab, failing the test after timeout.
func (b *browser) do(t *testing.T, what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v (page errors: %v)", what, err, b.errors())
	}
}

// eval evaluates a JavaScript expression on the page.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// screenshot saves the whole page as PPNODE_SCREENSHOTS/name.png, if set.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	dir := os.Getenv("PPNODE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// dashStats are the page's counters (window.ppnodeDashboard.stats).
type dashStats struct {
	Updates     int     `json:"updates"`
	RenderMS    float64 `json:"renderMS"`
	MaxRenderMS float64 `json:"maxRenderMS"`
	Fetches     int     `json:"fetches"`
	FetchErrors int     `json:"fetchErrors"`
	LastError   string  `json:"lastError"`
}

const statsJS = `window.ppnodeDashboard.stats`

// A live job on 3 nodes, watched from its coordinator's dashboard: the
// plan graph, the measured Gantt chart, the loss curve and the accuracy
// appear; then a node of the plan leaves and the re-plan appears, with the
// plan on the two nodes left; the page logs no error.
func TestDashboard(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	a := c.Node("a")
	waitMembers(t, a, 3)
	spec := job.DefaultSpec()
	spec.ID = "dash"
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 2048
	// 64 steps an epoch, accuracy after each; long enough to outlast the
	// test, which cancels it.
	spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 200, 12000
	spec.Threads, spec.EvalEachEpoch = 1, true
	spec.Partition, spec.Schedule = "uniform", "1f1b"
	rep, err := a.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.Client().Cancel(ctx, rep.ID)
	})
	start := time.Now()
	jobSel := `.job[data-job="dash"]`
	b.do(t, "open the dashboard", 30*time.Second,
		chromedp.Navigate("https://"+a.HTTP+"/?poll=500"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-member="c"]`)),
		chromedp.WaitVisible(chromedp.CSS(jobSel+` .plan svg`)))
	if n := eval[int](t, b, `document.querySelectorAll('`+jobSel+` .plan g.stagebox').length`); n != 3 {
		t.Errorf("the plan graph has %d stages, want 3", n)
	}
	b.do(t, "the measured Gantt chart, the loss curve and an accuracy", 60*time.Second,
		chromedp.WaitVisible(chromedp.CSS(jobSel+` .gantt svg g.cell rect.fwd`)),
		chromedp.WaitVisible(chromedp.CSS(jobSel+` .losschart svg path.loss`)),
		chromedp.WaitVisible(chromedp.CSS(jobSel+` .accchart svg circle.accpt`)))
	t.Logf("plan, Gantt, loss and accuracy shown %v after the page opened", time.Since(start).Round(time.Millisecond))
	if rows := eval[int](t, b, `document.querySelectorAll('`+jobSel+` .gantt g.cell').length`); rows < 3 {
		t.Errorf("the Gantt chart has %d cells, want a row per stage", rows)
	}
	// The newest step's schedule: per stage, at least a forward and a
	// backward pass of each of the job's micro-batches, run and simulated.
	for _, cls := range []string{"ran", "sim"} {
		if n := eval[int](t, b, `document.querySelectorAll('`+jobSel+` .passes svg rect.`+cls+`').length`); n < 3*2*4 {
			t.Errorf("the schedule has %d %s passes, want at least a forward and a backward per micro-batch and stage", n, cls)
		}
	}
	b.screenshot(t, "dashboard-3-nodes")

	// Node c leaves: its layers move to a and b.
	left := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(c.Node("c")) }()
	b.do(t, "the re-plan after node c leaves", 60*time.Second,
		chromedp.WaitVisible(chromedp.CSS(jobSel+` .events tr.replan[data-trigger="leaving"]`)))
	b.do(t, "the plan on two nodes", 30*time.Second,
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('`+jobSel+` .plan g.stagebox').length === 2`, chromedp.WithPollingMutation()))
	t.Logf("re-plan shown %v after node c was told to leave", time.Since(left).Round(time.Millisecond))
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	b.do(t, "node c gone from the members", 30*time.Second,
		chromedp.Poll[chromedp.Void](`!document.querySelector('tr[data-member="c"] .st-alive')`, chromedp.WithPollingMutation()))
	b.do(t, "the Gantt chart of steps after the re-plan", 30*time.Second,
		chromedp.Poll[chromedp.Void](`(() => { const r = document.querySelectorAll('`+jobSel+` .gantt text'); return Array.from(r).some(e => e.textContent.startsWith('stage 1')) && !Array.from(r).some(e => e.textContent.startsWith('stage 2')); })()`,
			chromedp.WithPollingMutation()))
	b.screenshot(t, "dashboard-3-nodes-replan")

	st := eval[dashStats](t, b, statsJS)
	t.Logf("page: %d updates, last render %.1f ms, slowest %.1f ms, %d fetches", st.Updates, st.RenderMS, st.MaxRenderMS, st.Fetches)
	if st.FetchErrors > 0 {
		t.Errorf("the page failed to read the status %d times: %s", st.FetchErrors, st.LastError)
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// syntheticStatus is the status of the first node of an n-node cluster
// running one job with a stage on every node, at step `step` of a long
// run: every list the page draws is full.
func syntheticStatus(n, step int) nodes.Status {
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	name := func(i int) string { return fmt.Sprintf("node-%02d", i) }
	st := nodes.Status{Name: name(0), Version: "test", HTTP: "127.0.0.1:8080", Profile: nodes.Profile{GFLOPS: 40, Memory: 8 << 30, Threads: 4, CPULimit: 2}}
	for i := range n {
		m := nodes.MemberStatus{Name: name(i), State: nodes.MemberAlive, HTTP: fmt.Sprintf("10.0.%d.%d:8080", i/200, i%200+1), Version: "test",
			Profile: nodes.Profile{GFLOPS: 10 + float64(i%7)*5, Memory: uint64(4+i%4) << 30, Threads: 1 + i%8}}
		if i%3 == 0 {
			m.Profile.CPULimit = 0.5 + float64(i%4)/2
		}
		if i == n-1 {
			m.State = nodes.MemberLeft
		}
		st.Members = append(st.Members, m)
	}
	js := job.Status{ID: "big", State: job.StateTraining, Model: "resnet50", Step: step, Total: 100000, Loss: 2.3 * math.Exp(-float64(step)/3000),
		SamplesPerSec: 900 + float64(step%50), Schedule: "1f1b", MicroBatches: 64, PredictedMS: 420, LatestCut: step - step%200,
		Cuts: step / 200, CheckpointEvery: 200, Started: started}
	var plan []string
	for k := range n {
		ss := job.StageStatus{ID: k, Node: name(k), Layers: fmt.Sprintf("l%d-l%d", 4*k, 4*k+3), Params: int64(1e5 * (k + 1)),
			ForwardMS: 100 + float64(k%5)*10, BackwardMS: 200 + float64(k%3)*20, UpdateMS: 5, WaitMS: 90, WallMS: 400}
		if k < n-1 {
			ss.To = []int{k + 1}
		}
		js.Stages = append(js.Stages, ss)
		plan = append(plan, fmt.Sprintf("l%d-l%d@%s", 4*k, 4*k+3, name(k)))
	}
	js.Plan = strings.Join(plan, "; ")
	for s := range job.LastSteps {
		at := 3.6e6 - float64(job.LastSteps-s)*450
		ls := job.StepTiming{Step: step - job.LastSteps + 1 + s, AtMS: at, WallMS: 430}
		for k := range n {
			ls.Stages = append(ls.Stages, job.StageStepTiming{ForwardMS: 100 + float64(k%5)*10, BackwardMS: 200, UpdateMS: 5,
				WaitMS: 400 - 305 - float64(k%5)*10, SendMS: 30, WallMS: 400})
		}
		js.LastSteps = append(js.LastSteps, ls)
	}
	// The newest step's passes, as run and as simulated: 1F1B's 2 x 64 a
	// stage.
	js.Passes, js.PredictedPasses = make([][]job.PassTiming, n), make([][]job.PassTiming, n)
	for k := range n {
		for m := range 2 * js.MicroBatches {
			op := "forward"
			if m%2 == 1 {
				op = "backward"
			}
			p := job.PassTiming{Op: op, Micro: m / 2, StartMS: 3 * float64(k+m), MS: 2}
			js.Passes[k] = append(js.Passes[k], p)
			js.PredictedPasses[k] = append(js.PredictedPasses[k], p)
		}
	}
	for i := range job.MaxLossPoints {
		s := (i + 1) * step / job.MaxLossPoints
		js.LossHistory = append(js.LossHistory, job.LossPoint{Step: s, Loss: 2.3*math.Exp(-float64(s)/3000) + 0.05*math.Sin(float64(i))})
	}
	for e := range 40 {
		js.Accuracy = append(js.Accuracy, job.EvalResult{Step: 1250 * (e + 1), Epoch: e + 1, Accuracy: 1 - 0.9*math.Exp(-float64(e)/8)})
	}
	js.Evaluation = &job.Evaluation{Step: step, Done: 700, Samples: 1997} // an epoch's end
	for r := range 60 {
		js.Replans = append(js.Replans, job.Replan{Step: 100 + 800*r, Reason: "measured speeds drifted", Trigger: job.TriggerSpeeds, Gain: 0.12,
			BeforeMS: 480, AfterMS: 420, MeasuredBeforeMS: 470, MeasuredAfterMS: 425, MovedMS: 800, Plan: js.Plan, Method: "direct", StateBytes: 1 << 28,
			Speeds: map[string]float64{name(r % n): 0.8}})
	}
	for r := range 20 {
		js.Recoveries = append(js.Recoveries, job.Recovery{Cause: "node " + name(r%n) + " failed", Step: 500 + 2000*r, Replayed: 150, DetectMS: 2100, RestoreMS: 3000, Plan: js.Plan})
	}
	for k := range n - 1 {
		for _, d := range [][2]int{{k, k + 1}, {k + 1, k}} {
			js.Links = append(js.Links, job.LinkStatus{From: name(d[0]), To: name(d[1]), MbitPerSec: 940, RTTMS: 0.3, Source: "probe", WireBytes: 1 << 33,
				Kinds: []job.LinkKind{{Kind: "activation", Codec: "zstd", Ratio: 1.8}, {Kind: "gradient", Codec: "raw", Ratio: 1}}})
		}
	}
	// A regression trained under mse: a test loss after each epoch, no accuracy.
	reg := job.Status{ID: "reg", State: job.StateTraining, Model: "regressor.onnx", Step: 300, Total: 1000, Loss: 0.02,
		LossName: "mse", NoAccuracy: true, Started: started}
	for e := range 3 {
		reg.Accuracy = append(reg.Accuracy, job.EvalResult{Step: 100 * (e + 1), Epoch: e + 1, TestLoss: 0.1 / float64(e+1)})
	}
	// A click model under bce: an AUC after each epoch.
	clicks := job.Status{ID: "clicks", State: job.StateTraining, Model: "dlrm.onnx", Step: 200, Total: 1000, Loss: 0.5,
		LossName: "bce", Started: started}
	for e := range 2 {
		clicks.Accuracy = append(clicks.Accuracy, job.EvalResult{Step: 100 * (e + 1), Epoch: e + 1, Accuracy: 0.7, TestLoss: 0.5, AUC: 0.7 + 0.05*float64(e)})
	}
	st.Jobs = []nodes.JobStatus{{Status: js, Coordinator: name(0), Holders: []string{name(1)}, Replicas: 2}, {Status: reg, Coordinator: name(0)},
		{Status: clicks, Coordinator: name(0)}}
	return st
}

// The page stays responsive with a 64-node cluster's status: every
// update draws a bounded number of elements (whatever the history), in
// well under the polling interval; it stops polling while hidden and
// resumes when shown.
func TestDashboard64Nodes(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	const n = 64
	var calls atomic.Int64
	web := filepath.Join("..", "nodes", "web")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, filepath.Join(web, "index.html")) })
	mux.Handle("GET /web/", http.StripPrefix("/web/", http.FileServer(http.Dir(web))))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		step := 50000 + int(calls.Add(1))*7
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(syntheticStatus(n, step))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if body, err := json.Marshal(syntheticStatus(n, 50000)); err == nil {
		t.Logf("the synthetic status is %d kB", len(body)/1000)
	}
	b.do(t, "open the dashboard", 30*time.Second,
		chromedp.Navigate(srv.URL+"/?poll=250"),
		chromedp.WaitVisible(chromedp.CSS(`.job[data-job="big"] .gantt svg`)),
		chromedp.Poll[chromedp.Void](statsJS+`.updates >= 20`, chromedp.WithPollingTimeout(60*time.Second)))
	for _, tc := range []struct {
		sel      string
		min, max int
	}{
		{`tr[data-member]`, n, n},
		{`.job[data-job="big"] .plan g.stagebox`, n, n},
		{`.job[data-job="big"] .gantt g.cell`, n, 256},
		{`.job[data-job="big"] .passes rect.ran`, 1, 2048},
		{`.job[data-job="big"] .passes rect.sim`, 1, 2048},
		{`.job[data-job="big"] .passes rect`, 1, 2048},
		{`.job[data-job="big"] .events tbody tr`, 1, 12},
		{`.job[data-job="big"] .timeline polygon.ev-replan`, 60, 60},
		{`.job[data-job="big"] .links tbody tr`, 64, 64},
		{`.job[data-job="big"] .losschart path.loss`, 1, 1},
	} {
		if got := eval[int](t, b, `document.querySelectorAll('`+tc.sel+`').length`); got < tc.min || got > tc.max {
			t.Errorf("%s: %d elements, want %d to %d", tc.sel, got, tc.min, tc.max)
		}
	}
	if !eval[bool](t, b, `document.querySelector('.job[data-job="big"]').textContent.includes('700 / 1997 test samples')`) {
		t.Errorf("the page does not show the evaluation in progress")
	}
	// The regression's chart is its test loss after each epoch.
	title := eval[string](t, b, `document.querySelector('.job[data-job="reg"] h3[data-title="acc"]').textContent`)
	dots := eval[int](t, b, `document.querySelectorAll('.job[data-job="reg"] .accchart circle.accpt').length`)
	if title != "Test loss (mse)" || dots != 3 {
		t.Errorf("the mse job's second chart: %q with %d points, want \"Test loss (mse)\" with 3", title, dots)
	}
	// The click model's is its AUC, the newest in its heading.
	title = eval[string](t, b, `document.querySelector('.job[data-job="clicks"] h3[data-title="acc"]').textContent`)
	dots = eval[int](t, b, `document.querySelectorAll('.job[data-job="clicks"] .accchart circle.accpt').length`)
	if title != "Test AUC" || dots != 2 || !eval[bool](t, b, `document.querySelector('.job[data-job="clicks"]').textContent.includes('AUC 0.7500 (after step 200)')`) {
		t.Errorf("the bce job's second chart: %q with %d points, want \"Test AUC\" with 2, and the newest AUC shown", title, dots)
	}
	elems := eval[int](t, b, `document.getElementsByTagName('*').length`)
	st := eval[dashStats](t, b, statsJS)
	t.Logf("64 nodes: %d updates, last render %.1f ms, slowest %.1f ms (the first included); %d elements in the page", st.Updates, st.RenderMS, st.MaxRenderMS, elems)
	// A fixed cost: the elements are bounded by the caps of the page, not
	// by the history (500 losses, 40 epochs, 60 re-plans, 20 recoveries,
	// 126 links).
	if elems > 12000 {
		t.Errorf("%d elements in the page for 64 nodes", elems)
	}
	// Far below the 2 s interval even on a loaded machine.
	if st.RenderMS > 500 {
		t.Errorf("an update took %.0f ms to draw", st.RenderMS)
	}
	b.screenshot(t, "dashboard-64-nodes")

	// Hidden, the page stops polling; shown again, it polls at once.
	b.do(t, "hide the page", 10*time.Second, chromedp.Evaluate[chromedp.Void](`Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
		document.dispatchEvent(new Event('visibilitychange'))`))
	hidden := calls.Load()
	// Four polling intervals, on the page's clock.
	b.do(t, "wait hidden", 10*time.Second, chromedp.Evaluate[chromedp.Void](`new Promise((r) => setTimeout(r, 1000))`, chromedp.EvalAwaitPromise))
	if got := calls.Load(); got > hidden+1 { // one request may have been under way
		t.Errorf("the hidden page read the status %d times in 1 s", got-hidden)
	}
	b.do(t, "show the page", 10*time.Second, chromedp.Evaluate[chromedp.Void](`Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'visible'});
		document.dispatchEvent(new Event('visibilitychange'))`))
	before := eval[int](t, b, statsJS+`.updates`)
	b.do(t, "polling again", 10*time.Second, chromedp.Poll[chromedp.Void](statsJS+`.updates > `+strconv.Itoa(before)))
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// cpuTime is the CPU time (user and system) process pid has used.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ... utime stime: fields 14 and 15, counted
	// after the comm, which may hold spaces.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on
// Linux's every architecture but alpha and ia64).
const clockTicks = 100

// What the dashboard costs a node (it must stay under 1% of a node's CPU
// while a job runs and nobody watches, under 3% while one browser
// watches). The same job runs on 3 nodes four times, A B A B: A
// with the browser on a blank page, B with it on the coordinator's
// dashboard (polling every 2 s); the CPU time of each node's process over
// the job comes from /proc/PID/stat. Then the cost of one status read,
// what the page does every 2 s, is measured on its own.
//
//	PPNODE_DASHBOARD_CPU=1 go test -count=1 -run TestDashboardCPU -v ./integration/
func TestDashboardCPU(t *testing.T) {
	if os.Getenv("PPNODE_DASHBOARD_CPU") == "" {
		t.Skip("a measurement (several minutes): set PPNODE_DASHBOARD_CPU=1")
	}
	steps := 6000
	if v, err := strconv.Atoi(os.Getenv("PPNODE_DASHBOARD_CPU_STEPS")); err == nil && v > 0 {
		steps = v
	}
	b := newBrowser(t)
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	a := c.Node("a")
	waitMembers(t, a, 3)
	ns := c.Nodes()
	cpus := func() []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			var err error
			if out[i], err = cpuTime(n.cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	type round struct {
		watched bool
		wall    time.Duration
		cpu     []time.Duration // per node
	}
	var rounds []round
	for i, watched := range []bool{false, true, false, true, false, true} {
		page := "about:blank"
		if watched {
			page = "https://" + a.HTTP + "/"
		}
		b.do(t, "open "+page, 30*time.Second, chromedp.Navigate(page))
		if watched {
			b.do(t, "the dashboard", 30*time.Second, chromedp.WaitVisible(chromedp.CSS(`tr[data-member="a"]`)))
		}
		spec := job.DefaultSpec()
		spec.ID = fmt.Sprintf("cpu-%d", i)
		spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 2048
		spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 1000, steps
		spec.Threads, spec.Partition, spec.Schedule = 1, "uniform", "1f1b"
		// Nothing else reads the API while the job runs: its end is
		// awaited in the coordinator's log.
		before, start := cpus(), time.Now()
		if _, err := a.Submit(spec); err != nil {
			t.Fatal(err)
		}
		if _, err := a.WaitLog("job="+spec.ID+" seconds=", 10*time.Minute); err != nil { // "nodes: job done"
			t.Fatal(err)
		}
		r := round{watched: watched, wall: time.Since(start), cpu: cpus()}
		for k := range r.cpu {
			r.cpu[k] -= before[k]
		}
		rounds = append(rounds, r)
		t.Logf("round %d (%s): %d steps in %.1f s; CPU a %.2f s (%.1f%%), b %.2f s, c %.2f s", i+1, map[bool]string{false: "A, nobody watching", true: "B, one browser watching"}[watched],
			steps, r.wall.Seconds(), r.cpu[0].Seconds(), 100*r.cpu[0].Seconds()/r.wall.Seconds(), r.cpu[1].Seconds(), r.cpu[2].Seconds())
	}
	// Per node, A and B: CPU seconds over the rounds' wall time (a share
	// of one CPU) and per job. Nodes b and c are not watched: how much
	// they move from A to B is the machine's noise.
	var cpu [2][3]float64
	var wall [2]float64
	for _, r := range rounds {
		k := map[bool]int{false: 0, true: 1}[r.watched]
		wall[k] += r.wall.Seconds()
		for i := range 3 {
			cpu[k][i] += r.cpu[i].Seconds()
		}
	}
	for i, name := range []string{"a (coordinator, watched)", "b", "c"} {
		t.Logf("node %s: %.2f%% of a CPU nobody watching, %.2f%% one browser watching (%+.2f points); CPU per job %+.1f%%",
			name, 100*cpu[0][i]/wall[0], 100*cpu[1][i]/wall[1], 100*(cpu[1][i]/wall[1]-cpu[0][i]/wall[0]), 100*(cpu[1][i]/cpu[0][i]-1))
	}

	// One status read on its own: N reads from here against the same time
	// idle.
	b.do(t, "close the page", 10*time.Second, chromedp.Navigate("about:blank"))
	const reads = 400
	t0, w0 := cpus()[0], time.Now()
	for range reads {
		if _, err := a.Status(); err != nil {
			t.Fatal(err)
		}
	}
	busy, busyWall := cpus()[0]-t0, time.Since(w0)
	idleStart, i0 := cpus()[0], time.Now()
	idleDone := time.NewTimer(busyWall)
	<-idleDone.C // an idle baseline as long as the reads took
	idle, idleWall := cpus()[0]-idleStart, time.Since(i0)
	per := (busy.Seconds() - idle.Seconds()*busyWall.Seconds()/idleWall.Seconds()) / reads
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(st)
	t.Logf("GET /v1/status (%d kB, %d jobs): %.2f ms of node a's CPU each; a page polling every 2 s: %.3f%% of a CPU", len(body)/1000, len(st.Jobs), 1e3*per, 100*per/2)
}
