package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// TestMain runs this test binary as the CLI when asked to (a child that
// runs as another user).
func TestMain(m *testing.M) {
	if os.Getenv("PPNODE_TEST_AS_CLI") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// localNode starts a node without credentials, as `join` does: its local
// token in tokenFile, jobs' files in files.
func localNode(t *testing.T, tokenFile, files string) *nodes.Agent {
	t.Helper()
	a, err := nodes.Start(nodes.Config{Name: "a", Bind: "127.0.0.1:0", Threads: 1, ProfileFor: 20 * time.Millisecond,
		TokenFile: tokenFile, Files: files, Logger: slog.New(slog.DiscardHandler), ActorLogLevel: slog.LevelError})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// asNobody runs the CLI as the user nobody (uid and gid 65534) and
// returns its exit code and output.
func asNobody(t *testing.T, args ...string) (int, string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("running as another user needs root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A copy nobody may run (the test binary's directory is root's).
	dir, err := os.MkdirTemp("", "ppnode-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "ppnode.test")
	b, err := os.ReadFile(self)
	if err == nil {
		err = os.WriteFile(bin, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PPNODE_TEST_AS_CLI=1", "HOME=/nonexistent", "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// A node without credentials serves its own user's CLI, which reads the
// local token, and refuses another local user's with 401.
func TestLocalUserWithoutTokenIsRefused(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "state", "http-token")
	a := localNode(t, tokenFile, t.TempDir())
	spec := []string{"--model", "mlp32", "--width", "16", "--data", "synthetic:8x8x1:4", "--synthetic-samples", "96",
		"--batch", "24", "--micro-batches", "4", "--steps", "2", "--threads", "1"}

	for _, args := range [][]string{
		{"status", "--via", a.HTTPAddr()},
		append([]string{"train", "--via", a.HTTPAddr()}, spec...),
		{"cancel", "--via", a.HTTPAddr(), "job-1"},
	} {
		code, out := asNobody(t, args...)
		if code == 0 || !strings.Contains(out, "HTTP 401") || !strings.Contains(out, "local token") {
			t.Errorf("nobody: ppnode %s: exit %d, %q: want a 401 naming the local token", args[0], code, out)
		}
	}
	// nobody cannot read the token either.
	if code, out := asNobody(t, "status", "--via", a.HTTPAddr(), "--token-file", tokenFile); code == 0 || !strings.Contains(out, "permission denied") {
		t.Errorf("nobody with --token-file %s: exit %d, %q", tokenFile, code, out)
	}
	if js := a.Jobs(); len(js) != 0 {
		t.Fatalf("nobody's job ran: %+v", js)
	}

	// Any client without the token (no header, a wrong one) gets 401.
	for _, auth := range []string{"", "Bearer " + strings.Repeat("0", 64)} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+a.HTTPAddr()+"/v1/status", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /v1/status with Authorization %q: %s, want 401", auth, res.Status)
		}
	}

	// The node's user is served: status, and a job to its end.
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--via", a.HTTPAddr(), "--token-file", tokenFile}, &out, &errb); code != 0 {
		t.Fatalf("status with the token: exit %d: %s", code, errb.String())
	}
	out.Reset()
	if code := run(append([]string{"train", "--json", "--via", a.HTTPAddr(), "--token-file", tokenFile}, spec...), &out, &errb); code != 0 {
		t.Fatalf("train --via with the token: exit %d: %s", code, errb.String())
	}
}

// A job cannot make a node read a file outside its files directory: not
// a root-only file elsewhere, not through a symbolic link inside; the
// error names the path, never the file's bytes.
func TestJobFilesStayInsideFilesDir(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "http-token")
	files, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret.safetensors")
	if err := os.WriteFile(secret, []byte("\x08\x00\x00\x00\x00\x00\x00\x00SECRETXX"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(files, "w.safetensors")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	a := localNode(t, tokenFile, files)
	var errb bytes.Buffer
	if code := run([]string{"status", "--via", a.HTTPAddr(), "--token-file", tokenFile}, io.Discard, &errb); code != 0 {
		t.Fatalf("status: %s", errb.String())
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	c := nodes.NewClientWith(a.HTTPAddr(), nodes.TokenClient(strings.TrimSpace(string(tok))))
	for _, init := range []string{secret, link} {
		s := job.DefaultSpec()
		s.Model, s.Data, s.Init, s.Width, s.SyntheticSamples = "mlp32", "synthetic:8x8x1:4", init, 16, 96
		s.Batch, s.MicroBatches, s.Steps, s.Epochs = 24, 4, 1, 0
		_, err := c.Submit(context.Background(), s)
		if !errors.Is(err, job.ErrSpec) || !strings.Contains(err.Error(), init) || !strings.Contains(err.Error(), "outside") ||
			strings.Contains(err.Error(), "SECRET") {
			t.Errorf("--init %s: %v: want a 400 naming the path as outside %s, without the file's bytes", init, err, files)
		}
	}
}
