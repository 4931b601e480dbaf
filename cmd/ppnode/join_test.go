package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

func TestJoinFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"join"}, "--name is required"},
		{[]string{"join", "--name", "a", "extra"}, "unexpected argument"},
		{[]string{"join", "--name", "a", "--bind", "127.0.0.1"}, "--bind"},
		{[]string{"join", "--name", "a", "--seeds", "127.0.0.1:7946,nohost"}, "--seeds"},
		{[]string{"join", "--name", "a", "--http", "8080"}, "--http"},
		{[]string{"join", "--name", "a", "--advertise", "x"}, "--advertise"},
		{[]string{"join", "--name", "a", "--actor-bind", "x"}, "--actor-bind"},
		{[]string{"join", "--name", "a", "--threads", "-2"}, "--threads"},
		{[]string{"join", "--name", "a", "--memory", "1XB"}, "--memory"},
		{[]string{"join", "--name", "a", "--memory", "0"}, "--memory"},
		{[]string{"plan", "--recompute", "some"}, "unknown recomputation"},
		{[]string{"join", "--name", "a", "--data-ports", "7999-7950"}, "--data-ports"},
		{[]string{"join", "--name", "a", "--log-level", "loud"}, "--log-level"},
		{[]string{"join", "--nope"}, "flag provided but not defined"},
		{[]string{"join", "--name", "a", "--data-dir", ""}, `--data-dir "": give a directory, or "none"`},
		{[]string{"join", "--name", "a/b"}, "cannot name the default data directory"},
		{[]string{"join", "--name", ".."}, "cannot name the default data directory"},
		{[]string{"join", "--name", "a\nb", "--data-dir", "none"}, `--name: node name "a\nb": want 1 to 256 bytes of UTF-8 without control characters`},
		{[]string{"join", "--name", strings.Repeat("n", 5000), "--data-dir", "none"}, `--name: node name "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"... (5000 bytes): want 1 to 256 bytes`},
		{[]string{"join", "--name", "a\xffb", "--data-dir", "none"}, "--name: node name"},
		{[]string{"status"}, "--via"},
		{[]string{"status", "--via", "nohost"}, "--via"},
		{[]string{"train", "--via", "nohost"}, "--via"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, errb.String(), c.msg)
		}
	}
}

// A node's data dir defaults to a directory per node name under the
// user's state directory; "none" turns the store off.
func TestJoinDataDir(t *testing.T) {
	state, home := t.TempDir(), t.TempDir()
	t.Setenv("HOME", home)
	for _, c := range []struct {
		xdg  string
		args []string
		want string
	}{
		{state, []string{"--name", "a"}, filepath.Join(state, "ppnode", "a")},
		{"", []string{"--name", "b"}, filepath.Join(home, ".local", "state", "ppnode", "b")},
		{"relative/state", []string{"--name", "b"}, filepath.Join(home, ".local", "state", "ppnode", "b")}, // not absolute: ignored
		{state, []string{"--name", "a", "--data-dir", "/srv/ppnode"}, "/srv/ppnode"},
		{state, []string{"--name", "a", "--data-dir=none"}, ""},
		{state, []string{"--name", "a/b", "--data-dir", "none"}, ""},
	} {
		t.Setenv("XDG_STATE_HOME", c.xdg)
		cfg, _, err := joinConfig(c.args, io.Discard)
		if err != nil || cfg.DataDir != c.want {
			t.Errorf("XDG_STATE_HOME=%q %v: data dir %q (%v), want %q", c.xdg, c.args, cfg.DataDir, err, c.want)
		}
	}
}

// startNodes starts n agents in this process, joined through the first.
func startNodes(t *testing.T, n int) []*nodes.Agent {
	t.Helper()
	var as []*nodes.Agent
	for i := range n {
		cfg := nodes.Config{Name: string(rune('a' + i)), Bind: "127.0.0.1:0", Threads: 1, ProfileFor: 20 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler), ActorLogLevel: slog.LevelError}
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
	return as
}

// train --via runs a job in the cluster with the result of train --local,
// and status shows it.
func TestTrainViaMatchesLocal(t *testing.T) {
	as := startNodes(t, 2)
	args := []string{"--deterministic", "--model", "mlp32", "--width", "16", "--data", "synthetic:8x8x1:4",
		"--synthetic-samples", "96", "--batch", "24", "--micro-batches", "4", "--steps", "3", "--threads", "1"}
	local := trainJSON(t, args...)

	// The second node is in the first's membership once b is started
	// (Start joins through the seed before it returns), so a plan over two
	// nodes can be asked for.
	var out, errb bytes.Buffer
	code := run(append([]string{"train", "--json", "--via", as[1].HTTPAddr(), "--partition", "uniform", "--schedule", "gpipe"}, args...), &out, &errb)
	if code != 0 {
		t.Fatalf("train --via: exit %d: %s", code, errb.String())
	}
	var res job.Result
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if res.WeightsSHA256 != local.WeightsSHA256 || len(res.Nodes) != 2 || res.Plan == "" {
		t.Fatalf("train --via: weights %s nodes %v plan %q; local weights %s", res.WeightsSHA256, res.Nodes, res.Plan, local.WeightsSHA256)
	}
	if !strings.Contains(errb.String(), "stage 1 on") {
		t.Errorf("the plan is not shown: %s", errb.String())
	}
	// The same weights with the zero-bubble schedule, and with stages that
	// recompute their activations (which status lists).
	for _, flags := range [][]string{{"--schedule", "zb"}, {"--schedule", "1f1b", "--recompute", "all"}} {
		out.Reset()
		errb.Reset()
		code := run(append(append([]string{"train", "--json", "--via", as[0].HTTPAddr(), "--partition", "uniform"}, flags...), args...), &out, &errb)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var r job.Result
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); code != 0 || err != nil || r.WeightsSHA256 != local.WeightsSHA256 || r.Schedule != flags[1] {
			t.Fatalf("train --via %v: exit %d, %s schedule, weights %s; local %s: %s", flags, code, r.Schedule, r.WeightsSHA256, local.WeightsSHA256, errb.String())
		}
	}

	out.Reset()
	errb.Reset()
	if code := run([]string{"status", "--via", as[0].HTTPAddr()}, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"NODE", "a ", "b ", "alive", "job ", "on b", "done", "STAGE", "stages s0, s1 recompute their activations"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}

	// A refused spec is a usage error with the node's message.
	errb.Reset()
	code = run([]string{"train", "--via", as[0].HTTPAddr(), "--model", "mlp32", "--data", "synthetic:8x8x1:4", "--partition", "fc1-fc8@a; fc10-fc32@b"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "fc9") {
		t.Errorf("bad partition: exit %d, stderr %q", code, errb.String())
	}
	// The node checks the whole spec: the command sends it as given.
	errb.Reset()
	code = run([]string{"train", "--via", as[0].HTTPAddr(), "--data", "synthetic:8x8x1:4", "--batch", "4", "--micro-batches", "8"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "need 1 <= micro-batches (8) <= batch (4)") || !strings.Contains(errb.String(), "HTTP 400") {
		t.Errorf("bad micro-batches: exit %d, stderr %q", code, errb.String())
	}
}

// join prints its ready line, serves until SIGINT, then leaves and returns.
func TestJoinRunsUntilSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("sends SIGINT to the test process")
	}
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state) // the default data dir is under it
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"join", "--name", "j", "--bind", "127.0.0.1:0", "--log-level", "error"}, pw, &errb)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no ready line: %v (stderr %s)", err, errb.String())
	}
	js, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	var ready readyLine
	if !ok || json.Unmarshal([]byte(js), &ready) != nil || ready.Name != "j" || ready.Gossip == "" || ready.Actors == "" || ready.HTTP == "" {
		t.Fatalf("ready line %q", line)
	}
	var out bytes.Buffer
	if code := run([]string{"status", "--via", ready.HTTP, "--json"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), `"name":"j"`) {
		t.Fatalf("status of the joined node: exit %d: %s", code, out.String())
	}
	dir := filepath.Join(state, "ppnode", "j")
	if want, _ := json.Marshal(dir); !strings.Contains(out.String(), `"data_dir":`+string(want)) {
		t.Errorf("status of the joined node does not show its default data dir %s: %s", dir, out.String())
	}
	if fi, err := os.Stat(filepath.Join(dir, "checkpoints")); err != nil || !fi.IsDir() {
		t.Errorf("no checkpoint store in the default data dir: %v", err)
	}
	go io.Copy(io.Discard, pr)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("join exited %d: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("join still runs 10 s after SIGINT")
	}
}
