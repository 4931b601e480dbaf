package trust

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A local token authenticates the CLI to a node that runs without cluster
// credentials: the node makes it on its first start, in a file only its
// user may read, and the CLI sends it in an Authorization header; another
// user of the machine cannot read it.

// TokenBytes is a token's length before hex encoding.
const TokenBytes = 32

// LocalToken returns the token in path, made (mode 0600, its directory
// 0700) if there is none. A token file that group or others may read, or
// that another user owns, is refused as a key file is.
func LocalToken(path string) (string, error) {
	tok, err := ReadToken(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return tok, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("trust: token: %w", err)
	}
	var b [TokenBytes]byte
	rand.Read(b[:])
	// Written aside and linked into place: nodes starting at once all end
	// up with the first one's token.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return "", fmt.Errorf("trust: token: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(hex.EncodeToString(b[:]) + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
			err = nil
		}
	}
	if err != nil {
		return "", fmt.Errorf("trust: token: %w", err)
	}
	return ReadToken(path)
}

// ReadToken reads the token in path, checked as LocalToken checks it.
func ReadToken(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("trust: token: %w", err)
	}
	if err := CheckKeyFile(path); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("trust: token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) != 2*TokenBytes {
		return "", fmt.Errorf("trust: the token file %s does not hold a token (%d hex digits); remove it and start the node again", path, 2*TokenBytes)
	}
	return tok, nil
}

// TokenMatches reports whether got is want, in constant time.
func TokenMatches(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
