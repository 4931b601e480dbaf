package trust

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrPermissions is returned for credentials others could read or change:
// a credentials directory writable by group or others or owned by another
// user, a key file group or others may read or write or that another user
// owns, a certificate writable by group or others or owned by another user
// (root may own directories and certificates). ssh refuses the same.
var ErrPermissions = errors.New("trust: unsafe permissions")

// What a checked path holds.
type credKind int

const (
	credDir credKind = iota
	credKey
	credCert
)

// checkPerms checks the mode and owner of a credentials path (fi is its
// os.Stat) for a process running as uid: the pure core of the checks,
// with a fix to run in each error.
func checkPerms(path string, fi fs.FileInfo, kind credKind, uid int) error {
	perm := fi.Mode().Perm()
	owner, known := ownerOf(fi)
	switch {
	case kind == credDir && !fi.IsDir():
		return fmt.Errorf("trust: %s is not a directory", path)
	case kind == credDir && perm&0o022 != 0:
		return fmt.Errorf("%w: the credentials directory %s has mode %04o (group or others may add or replace files); run chmod go-w %s", ErrPermissions, path, uint32(perm), path)
	case kind == credKey && perm&0o077 != 0:
		return fmt.Errorf("%w: the key file %s has mode %04o (group or others may read it); run chmod 600 %s", ErrPermissions, path, uint32(perm), path)
	case kind == credCert && perm&0o022 != 0:
		return fmt.Errorf("%w: the certificate %s has mode %04o (group or others may replace it); run chmod go-w %s", ErrPermissions, path, uint32(perm), path)
	case !known || owner == uid || owner == 0 && kind != credKey:
		return nil
	case kind == credKey:
		return fmt.Errorf("%w: the key file %s is owned by uid %d, not by this user (uid %d); run chown %d %s as root, or use your own copy", ErrPermissions, path, owner, uid, uid, path)
	}
	return fmt.Errorf("%w: %s is owned by uid %d, neither this user (uid %d) nor root; run chown %d %s as root", ErrPermissions, path, owner, uid, uid, path)
}

// checkPath stats path and checks it as checkPerms does for this process.
func checkPath(path string, kind credKind) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	return checkPerms(path, fi, kind, os.Getuid())
}

// CheckDir refuses a credentials directory that group or others may write
// to, or that a user other than this one or root owns.
func CheckDir(dir string) error { return checkPath(dir, credDir) }

// CheckKeyFile refuses a key file that group or others may read or write,
// or that another user owns.
func CheckKeyFile(path string) error { return checkPath(path, credKey) }

// checkCertFile refuses a certificate that group or others may write, or
// that a user other than this one or root owns.
func checkCertFile(path string) error { return checkPath(path, credCert) }
