package job

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A job's files must be regular files inside the node's files directory,
// reached without a symbolic link out of it; errors name the path only.
func TestConfine(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.safetensors")
	if err := os.WriteFile(secret, []byte("SECRETBYTES"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "sub", "w.safetensors")
	os.MkdirAll(filepath.Dir(in), 0o755)
	os.WriteFile(in, []byte("x"), 0o644)
	os.Symlink(secret, filepath.Join(dir, "link.safetensors"))
	os.Symlink(outside, filepath.Join(dir, "out"))
	os.Symlink(filepath.Join("sub", "w.safetensors"), filepath.Join(dir, "inner.safetensors")) // a link that stays inside
	files, err := OpenFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	for _, c := range []struct {
		init    string
		outside bool // want ErrOutside
		ok      bool
	}{
		{init: in, ok: true},
		{init: filepath.Join(dir, "inner.safetensors"), ok: true},
		{init: secret, outside: true},
		{init: filepath.Join(dir, "link.safetensors"), outside: true},
		{init: filepath.Join(dir, "out", "secret.safetensors"), outside: true},
		{init: filepath.Join(dir, "sub", "..", "..", filepath.Base(outside), "secret.safetensors"), outside: true},
		{init: "w.safetensors"},
		{init: filepath.Join(dir, "sub")},
		{init: filepath.Join(dir, "missing.safetensors")},
	} {
		s := DefaultSpec()
		s.Model, s.Data, s.Init = "mlp32", "synthetic", c.init
		err := files.Check(s)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v", c.init, err)
		case c.ok:
		case err == nil:
			t.Errorf("%s: accepted", c.init)
		case c.outside != errors.Is(err, ErrOutside) || !errors.Is(err, ErrSpec):
			t.Errorf("%s: %v: want ErrSpec, and ErrOutside %v", c.init, err, c.outside)
		case !strings.Contains(err.Error(), c.init) || strings.Contains(err.Error(), "SECRET"):
			t.Errorf("%s: %v: want the path named, never the file's bytes", c.init, err)
		}
	}
	s := DefaultSpec()
	s.Model, s.Data = filepath.Join(outside, "m.onnx"), filepath.Join(dir, "d.npz")
	if err := files.Check(s); !errors.Is(err, ErrOutside) {
		t.Errorf("an ONNX model outside: %v", err)
	}
}

// A file swapped for a link out of the directory after its spec was
// checked is refused when the job reads it, not followed.
func TestFilesSwappedAfterTheCheck(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.safetensors")
	if err := os.WriteFile(secret, []byte("SECRETBYTES"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	init := filepath.Join(dir, "w.safetensors")
	if err := os.WriteFile(init, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := OpenFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	s := DefaultSpec()
	s.Model, s.Data, s.Init = "mlp32", "synthetic", init
	if err := files.Check(s); err != nil {
		t.Fatal(err)
	}
	c, err := Check(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(init); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, init); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Spec().fileSHA256(init); err != nil {
		t.Fatalf("by path the link is followed (what Files prevents): %v", err)
	}
	_, err = c.ReadingFrom(files).Spec().fileSHA256(init)
	if !errors.Is(err, ErrOutside) || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("reading through Files: %v; want ErrOutside, without the file's bytes", err)
	}
	if _, err := c.ReadingFrom(files).Prepare(); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "leads outside") {
		t.Fatalf("preparing the job through Files: %v; want the link refused", err)
	}
}
