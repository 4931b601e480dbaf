package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nodes"
)

// Help is on stdout with exit status 0, as Go's tools do: `ppnode train
// --help | less` shows it.
func TestHelpOnStdout(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "usage: ppnode <command>"},
		{[]string{"-h"}, "cancel"},
		{[]string{"help"}, "version"},
		{[]string{"train", "--help"}, "-steps int"},
		{[]string{"train", "-h"}, "usage: ppnode train --local | --via host:port"},
		{[]string{"help", "train"}, "-epochs int"},
		{[]string{"help", "join"}, "-log-format string"},
		{[]string{"status", "--help"}, "usage: ppnode status --via host:port"},
		{[]string{"cancel", "--help"}, "usage: ppnode cancel --via host:port JOB"},
		{[]string{"replan", "--help"}, "usage: ppnode replan"},
		{[]string{"version", "--help"}, "-json"},
		{[]string{"demo", "--help"}, "-min-accuracy float"},
		{[]string{"plan", "--help"}, "-partition string"},
		{[]string{"init", "--help"}, "-creds string"},
		{[]string{"cert", "--help"}, "usage: ppnode cert NAME"},
		{[]string{"ckpt", "--help"}, "ppnode ckpt inspect"},
		{[]string{"ckpt", "inspect", "--help"}, "usage: ppnode ckpt inspect [--json] FILE"},
		{[]string{"bench", "--help"}, "usage: ppnode bench gemm"},
		{[]string{"bench", "gemm", "-h"}, "-size int"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != 0 || !strings.Contains(out.String(), c.want) || errb.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0 and %q on stdout, nothing on stderr", c.args, code, out.String(), errb.String(), c.want)
		}
	}
}

// A mistake in the command line exits 2 with a short message naming it
// and where to find help, not the flags' help on stderr.
func TestUsageErrorsAreShort(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
		cmd  string // the command to ask for help ("": ppnode's)
	}{
		{[]string{"train", "--bogus"}, "ppnode train: flag provided but not defined: -bogus", "train"},
		{[]string{"train", "--batch", "many"}, `invalid value "many" for flag -batch`, "train"},
		{[]string{"train", "--class-weights", "1,x"}, `invalid value "1,x" for flag -class-weights: "x" is not a number`, "train"},
		{[]string{"train", "--padding-idx", "tok.weight"}, `"tok.weight": want TABLE=ROW`, "train"},
		{[]string{"train", "--local", "--epochs", "0", "--steps", "0", "--data", "synthetic:4x4x1"}, "need epochs >= 1, or steps >= 1", "train"},
		{[]string{"status", "--via"}, "flag needs an argument: -via", "status"},
		{[]string{"join", "--name", "a", "--log-format", "xml"}, `--log-format "xml": want text or json`, "join"},
		{[]string{"demo", "--log-format", "yaml"}, `--log-format "yaml"`, "demo"},
		{[]string{"cancel", "--via", "127.0.0.1:1"}, "want one job id", "cancel"},
		{[]string{"cancel", "--via", "127.0.0.1:1", "../status"}, `job id "../status"`, "cancel"},
		{[]string{"cancel", "job-1"}, "--via host:port of a node is required", "cancel"},
		{[]string{"version", "now"}, `unexpected argument "now"`, "version"},
		{[]string{"ckpt"}, "want a subcommand: inspect or export", "ckpt"},
		{[]string{"ckpt", "inspect", "--bogus"}, "flag provided but not defined", "ckpt"},
		{[]string{"bench", "fft"}, "want a kernel to measure: ppnode bench gemm", "bench"},
		{[]string{"nope"}, `ppnode: unknown command "nope"`, ""},
		{[]string{"help", "nope"}, `ppnode: unknown command "nope"`, ""},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		help := "run 'ppnode --help'"
		if c.cmd != "" {
			help = "run 'ppnode " + c.cmd + " --help'"
		}
		lines := strings.Count(errb.String(), "\n")
		if code != 2 || !strings.Contains(errb.String(), c.msg) || !strings.Contains(errb.String(), help) || lines > 2 || out.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (%d lines); want exit 2 and two lines mentioning %q and %q",
				c.args, code, out.String(), errb.String(), lines, c.msg, help)
		}
	}
	// No command at all: the commands, on stderr (a usage error).
	var out, errb bytes.Buffer
	if code := run(nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "commands:") || out.Len() > 0 {
		t.Errorf("no command: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// `ppnode version` shows the version every node reports (nodes.Version)
// and how the binary was built; --version is the same.
func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"ppnode " + nodes.Version + "\n", runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version lacks %q:\n%s", want, out.String())
		}
	}
	var again bytes.Buffer
	if code := run([]string{"--version"}, &again, io.Discard); code != 0 || again.String() != out.String() {
		t.Errorf("--version: exit %d, %q; want %q", code, again.String(), out.String())
	}
	again.Reset()
	var b buildInfo
	if code := run([]string{"version", "--json"}, &again, io.Discard); code != 0 || json.Unmarshal(again.Bytes(), &b) != nil {
		t.Fatalf("version --json: exit %d, %q", code, again.String())
	}
	if want := readBuildInfo(); b != want || b.Version != nodes.Version || b.Go != runtime.Version() || b.OS != runtime.GOOS || b.Arch != runtime.GOARCH {
		t.Errorf("version --json: %+v, want %+v", b, want)
	}
}

// A job through the cluster: its result and `status --json` carry the loss
// history and every node's version, and `ppnode cancel` stops another job
// through a node that does not coordinate it.
func TestStatusAndCancel(t *testing.T) {
	as := startNodes(t, 2)
	a, b := as[0], as[1]
	args := []string{"--deterministic", "--model", "mlp32", "--width", "16", "--data", "synthetic:8x8x1:4",
		"--synthetic-samples", "96", "--batch", "24", "--micro-batches", "4", "--steps", "6", "--threads", "1"}
	var out, errb bytes.Buffer
	if code := run(append([]string{"train", "--json", "--via", a.HTTPAddr()}, args...), &out, &errb); code != 0 {
		t.Fatalf("train --via: exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res job.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if res.Steps != 6 || len(res.LossHistory) != 6 || res.LossHistory[5].Step != 6 || res.LossHistory[5].Loss != res.TrainLoss {
		t.Errorf("result: %d steps, loss history %v, last loss %v", res.Steps, res.LossHistory, res.TrainLoss)
	}

	out.Reset()
	if code := run([]string{"status", "--via", a.HTTPAddr(), "--json"}, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	var cs clusterStatus
	if err := json.Unmarshal(out.Bytes(), &cs); err != nil {
		t.Fatalf("status --json: %v", err)
	}
	if cs.Version != nodes.Version || len(cs.Members) != 2 {
		t.Errorf("status: version %q, %d members", cs.Version, len(cs.Members))
	}
	for _, m := range cs.Members {
		if m.Version != nodes.Version {
			t.Errorf("member %s reports version %q, want %q", m.Name, m.Version, nodes.Version)
		}
	}
	var found bool
	for _, st := range append([]nodes.Status{cs.Status}, cs.Others...) {
		for _, j := range st.Jobs {
			if j.ID == res.ID {
				found = true
				if fmt.Sprint(j.LossHistory) != fmt.Sprint(res.LossHistory) || fmt.Sprint(j.Result.LossHistory) != fmt.Sprint(res.LossHistory) {
					t.Errorf("status's loss history %v (result's %v), want %v", j.LossHistory, j.Result.LossHistory, res.LossHistory)
				}
			}
		}
	}
	if !found {
		t.Errorf("status --json does not show job %s: %s", res.ID, out.String())
	}
	out.Reset()
	if code := run([]string{"status", "--via", b.HTTPAddr()}, &out, &errb); code != 0 || !strings.Contains(out.String(), "VERSION") ||
		strings.Count(out.String(), " "+nodes.Version) < 2 {
		t.Errorf("status: exit %d, the members' versions (%s) not shown:\n%s", code, nodes.Version, out.String())
	}

	// A job that runs until cancelled, coordinated by a, cancelled
	// through b.
	spec := jobtest.SmallSpec()
	spec.Epochs, spec.Steps = 0, 1<<20
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := nodes.NewClient(a.HTTPAddr()).Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"cancel", "--via", b.HTTPAddr(), sub.ID}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "job "+sub.ID+" on a cancelled at step ") {
		t.Fatalf("cancel: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	st, err := a.Wait(ctx, sub.ID)
	if err != nil || !st.State.Ended() || st.State == job.StateDone || st.Step >= st.Total {
		t.Errorf("after cancel: %s at step %d/%d (%v)", st.State, st.Step, st.Total, err)
	}
	out.Reset()
	if code := run([]string{"cancel", "--via", a.HTTPAddr(), sub.ID}, &out, &errb); code != 0 || !strings.Contains(out.String(), "had already ended") {
		t.Errorf("cancel of an ended job: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run([]string{"cancel", "--via", a.HTTPAddr(), "no-such-job"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `ppnode cancel: no job "no-such-job": no node of the cluster`) {
		t.Errorf("cancel of an unknown job: exit %d, stderr %q", code, errb.String())
	}
}

// --steps runs exactly that many steps, more epochs than the default if it
// takes them; with --epochs too, the smaller wins and a line says so. The
// result carries the loss of every step.
func TestStepsOverEpochs(t *testing.T) {
	// 96 samples: 4 steps of 24 an epoch.
	base := []string{"train", "--local", "--json", "--model", "mlp32", "--width", "8", "--data", "synthetic:8x8x1:4",
		"--synthetic-samples", "96", "--batch", "24", "--micro-batches", "2", "--threads", "1"}
	for _, c := range []struct {
		args  []string
		steps int
		note  string
	}{
		{[]string{"--steps", "20"}, 20, ""},
		{[]string{}, 12, ""}, // the default, 3 epochs
		{[]string{"--epochs", "2", "--steps", "20"}, 8, "--epochs 2 ends the job after 8 steps, before --steps 20: the smaller wins"},
		{[]string{"--epochs", "5", "--steps", "4"}, 4, "--steps 4 ends the job before --epochs 5: the smaller wins"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(base, c.args...), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var r job.Result
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatalf("%v: last line %q", c.args, lines[len(lines)-1])
		}
		if r.Steps != c.steps || len(r.LossHistory) != c.steps || r.LossHistory[0].Step != 1 || r.LossHistory[c.steps-1] != (job.LossPoint{Step: c.steps, Loss: r.TrainLoss}) {
			t.Errorf("%v: %d steps, loss history %v; want %d steps", c.args, r.Steps, r.LossHistory, c.steps)
		}
		if c.note != "" && !strings.Contains(errb.String(), c.note) || c.note == "" && strings.Contains(errb.String(), "the smaller wins") {
			t.Errorf("%v: stderr %q; want the note %q", c.args, errb.String(), c.note)
		}
	}
}

// With stderr not a terminal, `ppnode train` prints its progress as plain
// lines between the plan and the result: at least the last step's, and
// the evaluations --eval-every and --eval-each-epoch ask for.
func TestTrainPipedProgress(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"train", "--local", "--model", "mlp32", "--width", "8", "--data", "synthetic:8x8x1:4",
		"--synthetic-samples", "96", "--batch", "24", "--micro-batches", "2", "--threads", "1", "--steps", "5", "--eval-every", "3",
		"--eval-each-epoch"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := errb.String()
	plan, step, done := strings.Index(s, "training mlp32"), strings.Index(s, "\n  step 5/5  loss "), strings.Index(s, "\ndone: 5 steps")
	if plan < 0 || step < plan || done < step || strings.Contains(s, "\r") {
		t.Errorf("stderr does not show the progress between the plan and the result as plain lines:\n%s", s)
	}
	// 96 training samples: an epoch is 4 steps of 24.
	three, four := strings.Index(s, "\ntest after step 3: loss "), strings.Index(s, "\ntest after step 4: loss ")
	if three < plan || four < three || done < four || strings.Count(s, "test after step") != 2 || !strings.Contains(s[four:], ", accuracy ") {
		t.Errorf("stderr does not show the evaluations after step 3 (--eval-every) and 4 (the epoch's end) alone:\n%s", s)
	}
}

// The progress as a pipe shows it: a line every printEvery, one at the end,
// each with the time left at the pace so far and the rate since the line
// before. Time is given, not read.
func TestProgressPiped(t *testing.T) {
	var w bytes.Buffer
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newProgress(&w, 100, 10, false, t0)
	for step := 1; step <= 100; step++ {
		p.update(t0.Add(time.Duration(step)*200*time.Millisecond), step, 1/float64(step), 50) // 20 s in all
	}
	p.done()
	p.done()
	want := `  step 25/100  loss 0.0400  50 samples/s  ETA 15s
  step 50/100  loss 0.0200  50 samples/s  ETA 10s (50 samples/s since the last line)
  step 75/100  loss 0.0133  50 samples/s  ETA 5s (50 samples/s since the last line)
  step 100/100  loss 0.0100  50 samples/s (50 samples/s since the last line)
`
	if w.String() != want {
		t.Errorf("got\n%s\nwant\n%s", w.String(), want)
	}

	// A job followed by polling: the same step seen again prints nothing
	// more, and done prints the last step seen if it was not printed.
	w.Reset()
	p = newProgress(&w, 100, 10, false, t0)
	p.update(t0.Add(6*time.Second), 30, 0.5, 50)
	p.update(t0.Add(12*time.Second), 30, 0.5, 50)
	p.update(t0.Add(13*time.Second), 60, 0.25, 46)
	p.done()
	want = `  step 30/100  loss 0.5000  50 samples/s  ETA 14s
  step 60/100  loss 0.2500  46 samples/s  ETA 9s (43 samples/s since the last line)
`
	if w.String() != want {
		t.Errorf("got\n%s\nwant\n%s", w.String(), want)
	}

	// --json: nothing.
	w.Reset()
	p = newProgress(&w, 100, 10, true, t0)
	p.update(t0.Add(time.Minute), 100, 0.5, 50)
	p.done()
	if w.Len() > 0 {
		t.Errorf("quiet progress printed %q", w.String())
	}
}

// On a terminal: one line redrawn in place at most every redrawEvery, with
// a bar and the time left, ended by done; a note clears it.
func TestProgressTerminal(t *testing.T) {
	var w bytes.Buffer
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newProgress(&w, 10, 4, false, t0)
	p.tty = true
	p.update(t0.Add(time.Second), 1, 2, 4)
	p.update(t0.Add(time.Second+100*time.Millisecond), 2, 1.5, 4) // too soon: not drawn
	p.note("re-planned")
	p.update(t0.Add(2*time.Second), 3, 1.25, 4)
	p.update(t0.Add(3*time.Second), 10, 1, 4)
	p.done()
	want := "\r[===>                          ] 1/10  loss 2.0000  4 samples/s  ETA 9s\033[K" +
		"\r\033[Kre-planned\n" +
		"\r[=========>                    ] 3/10  loss 1.2500  4 samples/s  ETA 5s\033[K" +
		"\r[==============================] 10/10  loss 1.0000  4 samples/s\033[K\n"
	if w.String() != want {
		t.Errorf("got\n%q\nwant\n%q", w.String(), want)
	}
}

// An evaluation in progress shows as plain lines once it has run
// printEvery, then every printEvery and when done (the same news again
// prints nothing), after the line of the step whose weights it evaluates;
// the steps show again from the next step on. A short one prints nothing.
// On a terminal it shows in the line at once, with a bar of the samples
// done. Polling calls update and then evaluating, as train does.
func TestProgressEvaluating(t *testing.T) {
	var w bytes.Buffer
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newProgress(&w, 20, 4, false, t0)
	p.update(t0.Add(time.Second), 9, 1, 4)
	for i, done := range []int{100, 100, 400, 900, 1000} {
		now := t0.Add(time.Duration(i+1) * 3 * time.Second)
		p.update(now, 10, 0.5, 4)
		p.evaluating(now, 10, done, 1000)
	}
	p.update(t0.Add(20*time.Second), 20, 0.25, 4)
	p.evaluating(t0.Add(21*time.Second), 20, 500, 1000)
	p.evaluating(t0.Add(22*time.Second), 20, 1000, 1000)
	p.done()
	want := `  step 10/20  loss 0.5000  4 samples/s  ETA 9s
  evaluating the weights after step 10: 400/1000 test samples
  evaluating the weights after step 10: 1000/1000 test samples
  step 20/20  loss 0.2500  4 samples/s (4 samples/s since the last line)
`
	if w.String() != want {
		t.Errorf("got\n%s\nwant\n%s", w.String(), want)
	}

	w.Reset()
	p = newProgress(&w, 10, 4, false, t0)
	p.tty = true
	p.update(t0.Add(time.Second), 10, 1, 4)
	p.evaluating(t0.Add(time.Second), 10, 500, 1000)
	p.update(t0.Add(time.Second+time.Millisecond), 10, 1, 4)
	p.evaluating(t0.Add(time.Second+time.Millisecond), 10, 600, 1000) // too soon
	p.done()
	want = "\r[==============================] 10/10  loss 1.0000  4 samples/s\033[K" +
		"\r[===============>              ] evaluating the weights after step 10: 500/1000 test samples\033[K\n"
	if w.String() != want {
		t.Errorf("got\n%q\nwant\n%q", w.String(), want)
	}
}

func TestFormatETA(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1500 * time.Millisecond:         "2s",
		83 * time.Second:                "1m23s",
		10*time.Minute + 29*time.Second: "10m",
		2*time.Hour + 3*time.Minute:     "2h3m",
	} {
		if got := formatETA(d); got != want {
			t.Errorf("formatETA(%v) = %q, want %q", d, got, want)
		}
	}
}

// join --log-format json logs one JSON object a line.
func TestJoinLogFormat(t *testing.T) {
	for _, c := range []struct {
		format, want string
	}{{"", `level=INFO msg=hello k=1`}, {"text", `level=INFO msg=hello k=1`}, {"json", `"level":"INFO","msg":"hello","k":1}`}} {
		args := []string{"--name", "a", "--data-dir", "none"}
		if c.format != "" {
			args = append(args, "--log-format", c.format)
		}
		_, lo, err := joinConfig(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var w bytes.Buffer
		lo.logger(&w).Info("hello", "k", 1)
		lo.logger(&w).Debug("not at info")
		if !strings.Contains(w.String(), c.want) || strings.Count(w.String(), "\n") != 1 {
			t.Errorf("--log-format %q: %q, want %q", c.format, w.String(), c.want)
		}
		if c.format == "json" {
			var m map[string]any
			if err := json.Unmarshal(w.Bytes(), &m); err != nil {
				t.Errorf("--log-format json: %q is not JSON: %v", w.String(), err)
			}
		}
	}
}

// The demo's default accuracy bar is for an epoch or more: a shorter run
// skips it and says so; one given on the command line always applies.
func TestDemoAccuracyCheck(t *testing.T) {
	short := &job.Result{Steps: 40, Epochs: 0.04, TestAccuracy: 0.6}
	full := &job.Result{Steps: 940, Epochs: 1, TestAccuracy: 0.6}
	for _, c := range []struct {
		res   *job.Result
		min   float64
		given bool
		err   string
		note  string
	}{
		{short, 0.95, false, "", "40 steps are 0.04 of an epoch: the accuracy check (0.95, for an epoch or more) is skipped"},
		{short, 0.95, true, "test accuracy 0.6000 is below 0.95", ""},
		{short, 0.5, true, "", ""},
		{full, 0.95, false, "test accuracy 0.6000 is below 0.95", ""},
		{full, 0, true, "", ""},
	} {
		var w bytes.Buffer
		err := demoCheckAccuracy(c.res, c.min, c.given, &w)
		badErr := c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err))
		badNote := c.note == "" && w.Len() > 0 || !strings.Contains(w.String(), c.note)
		if badErr || badNote {
			t.Errorf("%+v min %v given %v: error %v, note %q; want error %q, note %q", *c.res, c.min, c.given, err, w.String(), c.err, c.note)
		}
	}
}

// status names a job's loss beside its value unless it is the
// cross-entropy, and its result shows no accuracy under an error loss;
// a job in training shows its newest evaluation.
func TestStatusNamesTheLoss(t *testing.T) {
	js := nodes.JobStatus{Status: job.Status{ID: "j", Model: "dn.onnx", State: job.StateDone, Step: 3, Total: 3, Loss: 0.0112, LossName: nn.LossMSE,
		Result: &job.Result{Loss: nn.LossMSE, TestLoss: 0.0113, WeightsSHA256: "ab"}}}
	var b strings.Builder
	printStatus(&b, &clusterStatus{Status: nodes.Status{Name: "a", Jobs: []nodes.JobStatus{js}}})
	out := b.String()
	for _, want := range []string{"loss 0.0112 (mse),", "result: loss mse, test loss 0.0113"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "accuracy") {
		t.Errorf("an mse job's status shows an accuracy:\n%s", out)
	}
	// While it trains, the newest evaluation (--eval-every).
	js.State, js.Step, js.Total, js.Result, js.NoAccuracy = job.StateTraining, 250, 1000, nil, true
	js.Accuracy = []job.EvalResult{{Step: 100, TestLoss: 0.02}, {Step: 200, TestLoss: 0.015}}
	b.Reset()
	printStatus(&b, &clusterStatus{Status: nodes.Status{Name: "a", Jobs: []nodes.JobStatus{js}}})
	if out := b.String(); !strings.Contains(out, "\n  test after step 200: loss 0.0150\n") || strings.Contains(out, "accuracy") {
		t.Errorf("a training job's status lacks its newest evaluation, or shows an accuracy under mse:\n%s", out)
	}
}
