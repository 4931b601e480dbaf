//go:build unix

package trust

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Each unsafe credential makes Load fail with ErrPermissions, naming the
// path and the command that fixes it; with the fix, Load succeeds again.
func TestLoadChecksPermissions(t *testing.T) {
	const other = 65534 // nobody
	for _, tc := range []struct {
		name  string
		file  string // relative to the directory; "" is the directory
		mode  fs.FileMode
		owner int // -1: unchanged
		fix   string
	}{
		{"directory writable by all", "", 0o777, -1, "chmod go-w"},
		{"directory writable by the group", "", 0o770, -1, "chmod go-w"},
		{"directory of another user", "", 0o700, other, "chown"},
		{"key readable by all", "a.key", 0o644, -1, "chmod 600"},
		{"gossip key readable by the group", GossipKey, 0o640, -1, "chmod 600"},
		{"key of another user", "a.key", 0o600, other, "chown"},
		{"certificate writable by all", "a.crt", 0o666, -1, "chmod go-w"},
		{"CA certificate writable by all", CACert, 0o646, -1, "chmod go-w"},
		{"certificate of another user", "a.crt", 0o644, other, "chown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := cluster(t, "a")
			path := filepath.Join(dir, tc.file)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.owner >= 0 {
				if err := os.Chown(path, tc.owner, -1); err != nil {
					t.Skipf("cannot give %s to uid %d (needs root): %v", path, tc.owner, err)
				}
				defer os.Chown(path, os.Getuid(), -1)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, err = Load(dir, "a")
			if !errors.Is(err, ErrPermissions) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.fix+" ") {
				t.Fatalf("Load: %v; want ErrPermissions naming %s and %q", err, path, tc.fix)
			}
			os.Chown(path, os.Getuid(), -1)
			os.Chmod(path, fi.Mode().Perm())
			if _, err := Load(dir, "a"); err != nil {
				t.Fatalf("Load after the fix: %v", err)
			}
		})
	}
}

// Issue checks the directory and the CA key as Load does.
func TestIssueChecksPermissions(t *testing.T) {
	dir := cluster(t)
	os.Chmod(dir, 0o777)
	if _, err := Issue(dir, "a", RoleNode, nil); !errors.Is(err, ErrPermissions) {
		t.Fatalf("Issue in a directory writable by all: %v", err)
	}
	os.Chmod(dir, 0o700)
	os.Chmod(filepath.Join(dir, CAKey), 0o604)
	if _, err := Issue(dir, "a", RoleNode, nil); !errors.Is(err, ErrPermissions) {
		t.Fatalf("Issue with a CA key readable by all: %v", err)
	}
}

// fileInfo is an os.Stat result made up for checkPerms.
type fileInfo struct {
	mode fs.FileMode
	uid  uint32
}

func (f fileInfo) Name() string       { return "f" }
func (f fileInfo) Size() int64        { return 0 }
func (f fileInfo) Mode() fs.FileMode  { return f.mode }
func (f fileInfo) ModTime() time.Time { return time.Time{} }
func (f fileInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fileInfo) Sys() any           { return &syscall.Stat_t{Uid: f.uid} }

// The rules, whatever user runs the test: owners are the user's (1000),
// root's (0) or another's (1001).
func TestCheckPerms(t *testing.T) {
	const me = 1000
	for _, tc := range []struct {
		kind credKind
		mode fs.FileMode
		uid  uint32
		ok   bool
	}{
		{credDir, fs.ModeDir | 0o700, me, true},
		{credDir, fs.ModeDir | 0o755, me, true},
		{credDir, fs.ModeDir | 0o755, 0, true},
		{credDir, fs.ModeDir | 0o775, me, false},
		{credDir, fs.ModeDir | 0o757, me, false},
		{credDir, fs.ModeDir | 0o700, 1001, false},
		{credDir, 0o700, me, false}, // not a directory
		{credKey, 0o600, me, true},
		{credKey, 0o400, me, true},
		{credKey, 0o640, me, false},
		{credKey, 0o604, me, false},
		{credKey, 0o620, me, false},
		{credKey, 0o600, 0, false},
		{credKey, 0o600, 1001, false},
		{credCert, 0o644, me, true},
		{credCert, 0o644, 0, true},
		{credCert, 0o664, me, false},
		{credCert, 0o646, me, false},
		{credCert, 0o644, 1001, false},
	} {
		err := checkPerms("p", fileInfo{tc.mode, tc.uid}, tc.kind, me)
		if (err == nil) != tc.ok {
			t.Errorf("kind %d mode %v uid %d: %v, want ok %v", tc.kind, tc.mode, tc.uid, err, tc.ok)
		}
	}
}
