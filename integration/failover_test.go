package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// failoverCluster starts nodes a, b and c, one thread each, each with a
// checkpoint store in a directory of the test (returned by name).
func failoverCluster(t *testing.T) (*Cluster, map[string]string) {
	t.Helper()
	dirs := map[string]string{}
	var opts []NodeOptions
	for _, name := range []string{"a", "b", "c"} {
		dirs[name] = t.TempDir()
		opts = append(opts, NodeOptions{Name: name, Threads: 1, Args: []string{"--data-dir", dirs[name]}})
	}
	c := StartCluster(t, opts...)
	for _, name := range []string{"a", "b", "c"} {
		waitMembers(t, c.Node(name), 3)
	}
	return c, dirs
}

// failoverSpec is TestKillStageNode's job: long enough to lose its
// coordinator after the first cut and still train on.
func failoverSpec() job.Spec {
	spec := job.DefaultSpec()
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 1024
	spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 10, 200
	spec.Deterministic, spec.Threads = true, 1
	spec.Partition, spec.Schedule, spec.CheckpointEvery = "uniform", "1f1b", 20
	return spec
}

// trainArgs are the `ppnode train --via` flags of failoverSpec.
func trainArgs(via string, replicas int) []string {
	return []string{"train", "--json", "--via", via, "--deterministic", "--model", "mlp32", "--width", "64",
		"--data", "synthetic:8x8x1:4", "--synthetic-samples", "1024", "--batch", "32", "--micro-batches", "4",
		"--epochs", "10", "--steps", "200", "--threads", "1", "--partition", "uniform", "--schedule", "1f1b",
		"--checkpoint-every", "20", "--replicas", strconv.Itoa(replicas)}
}

// trainClient is a `ppnode train --via` process.
type trainClient struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{} // closed when the process has been waited for
	err            error         // its exit, valid after done
}

func startClient(t *testing.T, args []string) *trainClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	cl := &trainClient{done: make(chan struct{})}
	cl.cmd = exec.CommandContext(ctx, Binary(t), args...)
	cl.cmd.Stdout, cl.cmd.Stderr = &cl.stdout, &cl.stderr
	cl.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cl.cmd.WaitDelay = 2 * time.Second
	if err := cl.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cl.err = cl.cmd.Wait()
		close(cl.done)
	}()
	t.Cleanup(func() {
		select {
		case <-cl.done:
		default:
			cl.cmd.Process.Kill()
			<-cl.done
		}
	})
	return cl
}

// result waits for the client's exit and decodes its last line.
func (cl *trainClient) result(t *testing.T) job.Result {
	t.Helper()
	<-cl.done
	if cl.err != nil {
		t.Fatalf("ppnode train --via: %v\n%s", cl.err, cl.stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(cl.stdout.String()), "\n")
	var r job.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil || r.WeightsSHA256 == "" {
		t.Fatalf("ppnode train --via: last line is not a result: %q", lines[len(lines)-1])
	}
	return r
}

// waitDurableCut waits until a's job has a cut at step cut or later whose
// copies are all acknowledged, and returns the job's status then.
func waitDurableCut(t *testing.T, a *Node, cl *trainClient, cut int) job.Status {
	t.Helper()
	var st job.Status
	err := Poll("a durable cut on a", 2*time.Minute, 10*time.Millisecond, func() (bool, error) {
		select {
		case <-cl.done:
			return false, fmt.Errorf("the client ended before the kill: %v\n%s", cl.err, cl.stderr.String())
		default:
		}
		ns, err := a.Status()
		if err != nil || len(ns.Jobs) == 0 {
			return false, err
		}
		st = ns.Jobs[0].Status
		return st.LatestCut >= cut || st.State != job.StateTraining && st.Step > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateTraining || st.Step >= st.Total-20 {
		t.Fatalf("job %s at step %d/%d when it should lose its coordinator: make it longer", st.State, st.Step, st.Total)
	}
	return st
}

// cutFiles lists the steps of the cut files of job id in a node's store
// directory, oldest first.
func cutFiles(t *testing.T, dir, id string) []int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "checkpoints", id))
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".ckpt")
		if !ok || strings.HasPrefix(name, ".") || strings.Contains(name, ".") {
			continue
		}
		if s, err := strconv.ParseInt(name, 10, 64); err == nil {
			steps = append(steps, s)
		}
	}
	slices.Sort(steps)
	return steps
}

// writingCut reports whether the store under dir is writing a file: a
// cut it receives (".recv.ckpt.tmp-*" at its root) or one of job id's.
func writingCut(t *testing.T, dir, id string) bool {
	t.Helper()
	for _, d := range []string{filepath.Join(dir, "checkpoints"), filepath.Join(dir, "checkpoints", id)} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), ".tmp-") {
				return true
			}
		}
	}
	return false
}

// corruptCut flips bytes in the middle of a cut file.
func corruptCut(t *testing.T, dir, id string, step int64) {
	t.Helper()
	path := filepath.Join(dir, "checkpoints", id, fmt.Sprintf("%019d.ckpt", step))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b)/2+16; i++ {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// takenOver waits until b coordinates the job and has completed a step
// after taking it over, and returns its status then and the time that
// took from killed.
func takenOver(t *testing.T, b *Node, id string, killed time.Time) (nodes.JobStatus, time.Duration) {
	t.Helper()
	var st nodes.JobStatus
	err := Poll("the job's first step on b", 2*time.Minute, 10*time.Millisecond, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if st, err = b.Client().Job(ctx, id); err != nil {
			return false, nil // not taken over yet
		}
		return st.Takeover != nil && (int64(st.Step) > st.Takeover.Step || st.State == job.StateDone), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, time.Since(killed)
}

// SIGKILL of the coordinator's node after the first cut: the holder of the
// job's record (b, the first other node by name) takes the job over from
// that cut; the `ppnode train --via a` client finds it there, says so,
// and ends with the weights of the run without the fault.
func TestKillCoordinatorNode(t *testing.T) {
	t.Parallel()
	c, _ := failoverCluster(t)
	spec := failoverSpec()
	want := localSHA(t, spec)
	cl := startClient(t, trainArgs(c.Node("a").HTTP, 2))
	job := waitDurableCut(t, c.Node("a"), cl, 20)
	c.Kill(c.Node("a"))
	killed := time.Now()
	st, took := takenOver(t, c.Node("b"), job.ID, killed)
	tk := st.Takeover
	t.Logf("killed a at step %d (latest cut %d); b took over from step %d (%s) and completed a step %v after the kill (prepared in %.0f ms)",
		job.Step, job.LatestCut, tk.Step, tk.Source, took, tk.PrepareMS)
	if tk.From != "a" || tk.Step < int64(job.LatestCut) || tk.Step%20 != 0 || !strings.HasPrefix(tk.Source, "this node's store") {
		t.Errorf("takeover %+v; want from a, from b's own copy of a cut at step >= %d", *tk, job.LatestCut)
	}
	if replayed := job.Step - int(tk.Step); replayed > 2*20 {
		t.Errorf("%d steps replayed", replayed)
	}
	res := cl.result(t)
	if res.WeightsSHA256 != want {
		t.Errorf("weights %s after the coordinator's death, %s without it", res.WeightsSHA256, want)
	}
	line := fmt.Sprintf("coordinator a lost; job taken over by b from step %d", tk.Step)
	if !strings.Contains(cl.stderr.String(), line) {
		t.Errorf("the client did not say %q:\n%s", line, cl.stderr.String())
	}
}

// The newest cut on the successor is damaged when the coordinator's node
// dies: the successor skips it and resumes from the same step on the
// other holder (replicas 3), or, being the only holder (replicas 2), from
// its previous cut; the weights are still the fault-free ones.
func TestCorruptNewestCut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicas int
		cut      int // the durable cut to wait for
	}{
		{"other replica", 3, 20},
		{"previous cut", 2, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each has its own cluster and stores
			c, dirs := failoverCluster(t)
			spec := failoverSpec()
			want := localSHA(t, spec)
			cl := startClient(t, trainArgs(c.Node("a").HTTP, tc.replicas))
			job := waitDurableCut(t, c.Node("a"), cl, tc.cut)
			// Freeze a, so that no cut starts after the corruption, and
			// let b finish writing a cut whose bytes it already has (one a
			// froze halfway stays unfinished, and is dropped once a dies).
			// The successor cannot take over before a is killed: a frozen
			// node holds the check of its failure for 2 s.
			if err := c.Pause(c.Node("a")); err != nil {
				t.Fatal(err)
			}
			_ = Poll("b's cut writes to end", time.Second, 10*time.Millisecond, func() (bool, error) {
				return !writingCut(t, dirs["b"], job.ID), nil
			})
			steps := cutFiles(t, dirs["b"], job.ID)
			if len(steps) == 0 {
				t.Fatalf("no cut file on b although the cut at step %d is durable", job.LatestCut)
			}
			newest := steps[len(steps)-1]
			corruptCut(t, dirs["b"], job.ID, newest)
			c.Kill(c.Node("a"))
			killed := time.Now()
			corrupted := []int64{newest}
			// A cut that reached b after all is newer: damage it too (the
			// successor needs most of a second to see the failure).
			for _, s := range cutFiles(t, dirs["b"], job.ID) {
				if s > newest {
					corruptCut(t, dirs["b"], job.ID, s)
					corrupted = append(corrupted, s)
				}
			}
			st, took := takenOver(t, c.Node("b"), job.ID, killed)
			tk := st.Takeover
			t.Logf("corrupted b's cuts %v, killed a at step %d; b took over from step %d (%s), first step %v after the kill",
				corrupted, job.Step, tk.Step, tk.Source, took)
			for _, s := range corrupted {
				if !strings.Contains(tk.Source, fmt.Sprintf("step %d on b", s)) {
					t.Errorf("takeover source %q does not say that b's damaged cut at step %d was skipped", tk.Source, s)
				}
			}
			switch {
			case tk.Step == 0 || tk.Step > slices.Max(corrupted):
				t.Errorf("resumed from step %d; want a verified cut, at most step %d", tk.Step, slices.Max(corrupted))
			case tc.replicas == 2 && (tk.Step >= slices.Min(corrupted) || !strings.HasPrefix(tk.Source, "this node's store")):
				t.Errorf("resumed from step %d (%s); want b's own cut before step %d", tk.Step, tk.Source, slices.Min(corrupted))
			}
			res := cl.result(t)
			if res.WeightsSHA256 != want {
				t.Errorf("weights %s after the takeover from a damaged store, %s without the fault", res.WeightsSHA256, want)
			}
			if !strings.Contains(cl.stderr.String(), "coordinator a lost; job taken over by b from step") {
				t.Errorf("the client did not report the takeover:\n%s", cl.stderr.String())
			}
		})
	}
}

// A node hung long enough to be declared failed (its ping unanswered),
// then continued, rejoins; a job submitted afterwards runs stages on it
// and finishes. (Session 4 saw a job stay "starting" after a node came
// back; the endpoint to it had been dropped while it was away.)
func TestJobOnAReturnedNode(t *testing.T) {
	t.Parallel()
	c, _ := failoverCluster(t)
	a, n := c.Node("a"), c.Node("c")
	if err := c.Pause(n); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WaitLog("cluster: member failed, confirmed", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(n); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, a, 3)
	spec := failoverSpec()
	spec.ID, spec.Steps = "after-return", 40
	rep, err := a.Submit(spec)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if !strings.Contains(rep.Plan, "@c") {
		t.Fatalf("plan %s does not use the returned node c", rep.Plan)
	}
	st, err := a.WaitJob(rep.ID, 2*time.Minute, nil)
	if err != nil || st.State != job.StateDone {
		t.Fatalf("job on the returned node: %v, state %s %s", err, st.State, st.Error)
	}
	if len(st.Recoveries) != 0 {
		t.Errorf("recoveries %+v", st.Recoveries)
	}
}
