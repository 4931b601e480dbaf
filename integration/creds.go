package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/ppnode/ppnode/trust"
)

// The tests run their clusters as users should: with cluster credentials
// (mutual TLS, an encrypted gossip, authenticated data-plane links). One
// credentials directory serves the test binary; its path is PPNODE_CREDS
// in this process's environment, so every `ppnode` it starts finds it.
var creds struct {
	sync.Mutex
	dir    string
	client *trust.Identity
	err    error
}

// Creds returns the test binary's credentials directory with a node
// certificate for each name given, made on first use.
func Creds(names ...string) (string, error) {
	creds.Lock()
	defer creds.Unlock()
	if creds.dir == "" && creds.err == nil {
		creds.err = initCreds()
	}
	if creds.err != nil {
		return "", creds.err
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(creds.dir, n+".crt")); err == nil {
			continue
		}
		if _, err := trust.Issue(creds.dir, n, trust.RoleNode, nil); err != nil {
			return "", err
		}
	}
	return creds.dir, nil
}

func initCreds() error {
	dir, err := os.MkdirTemp("", "ppnode-test-creds-")
	if err != nil {
		return err
	}
	if err := trust.Init(dir); err != nil {
		os.RemoveAll(dir)
		return err
	}
	id, err := trust.Load(dir, trust.ClientName)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	creds.dir, creds.client = dir, id
	return os.Setenv("PPNODE_CREDS", dir)
}

// removeCreds removes the credentials directory (TestMain, at the end).
func removeCreds() {
	creds.Lock()
	defer creds.Unlock()
	if creds.dir != "" {
		os.RemoveAll(creds.dir)
	}
}

// withTLS returns base with the test client's certificate on its
// transport.
func withTLS(base *http.Client) (*http.Client, error) {
	if _, err := Creds(); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport)
	if t, ok := base.Transport.(*http.Transport); ok {
		tr = t
	}
	tr = tr.Clone()
	tr.TLSClientConfig = creds.client.ClientTLS()
	return &http.Client{Timeout: base.Timeout, Transport: tr}, nil
}
