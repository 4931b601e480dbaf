package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/ppnode/ppnode/nodes"
	"github.com/ppnode/ppnode/trust"
)

// defaultCreds is the credentials directory when neither --creds nor
// PPNODE_CREDS gives one: $XDG_CONFIG_HOME/ppnode, else ~/.config/ppnode.
func defaultCreds() string {
	if d := os.Getenv("PPNODE_CREDS"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CONFIG_HOME")
	if !filepath.IsAbs(base) {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		base = filepath.Join(home, ".config")
	}
	return filepath.Join(base, "ppnode")
}

// defaultTokenFile is the local token's file when --token-file is not
// given: PPNODE_TOKEN_FILE, else http-token in the user's state directory
// ($XDG_STATE_HOME/ppnode, else ~/.local/state/ppnode), which every node
// of the user without credentials shares.
func defaultTokenFile() string {
	if f := os.Getenv("PPNODE_TOKEN_FILE"); f != "" {
		return f
	}
	base, err := stateDir()
	if err != nil {
		return ""
	}
	return filepath.Join(base, "ppnode", "http-token")
}

const tokenUsage = "the local token of nodes without credentials, made by the first such node of this user\n" +
	"(env PPNODE_TOKEN_FILE; default: http-token in the user's state directory, ~/.local/state/ppnode)"

// tokenFlag registers --token-file on fs.
func tokenFlag(fs *flag.FlagSet) *string {
	return fs.String("token-file", defaultTokenFile(), tokenUsage)
}

// credsFlag registers --creds on fs.
func credsFlag(fs *flag.FlagSet) *string {
	return fs.String("creds", defaultCreds(), "the cluster's credentials directory (ppnode init; env PPNODE_CREDS)")
}

func runInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", "[--creds DIR]")
	dir := credsFlag(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := trust.Init(*dir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created a cluster in %s: its CA (ca.crt, ca.key), a gossip key (gossip.key) and a client certificate for this CLI (client.crt)\n", *dir)
	fmt.Fprintf(stdout, "next: ppnode cert NAME --host ADDRESS for each node; copy ca.crt, gossip.key, NAME.crt and NAME.key to it (keep ca.key here)\n")
	return nil
}

func runCert(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cert", "NAME [--host ADDR,...] [--client] [--creds DIR]")
	dir := credsFlag(fs)
	hosts := fs.String("host", "", "addresses (IPs or DNS names) the node serves at, comma-separated")
	client := fs.Bool("client", false, "a client's certificate (submits and cancels jobs) instead of a node's")
	// NAME may come before the flags.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	if name == "" || fs.NArg() > 1 {
		return usagef("want one NAME")
	}
	if err := trust.CheckName(name); err != nil {
		return usageError{err}
	}
	role := trust.RoleNode
	if *client {
		role = trust.RoleClient
	}
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	path, err := trust.Issue(*dir, name, role, hs)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s\n", path, strings.TrimSuffix(path, ".crt")+".key")
	return nil
}

// apiHTTP is the HTTP client of the CLI's calls to nodes: mutual TLS
// with the client certificate of the credentials directory (useCreds),
// plain HTTP with the nodes' local token without one.
var apiHTTP = http.DefaultClient

// useCreds loads the CLI's identity, client.crt in dir, if dir has one;
// otherwise the local token in tokenFile, if there is one (a node without
// credentials answers 401 to a request without it, and says why).
func useCreds(dir, tokenFile string) error {
	if _, err := os.Stat(filepath.Join(dir, trust.ClientName+".crt")); errors.Is(err, os.ErrNotExist) {
		apiHTTP = http.DefaultClient
		if tokenFile == "" {
			return nil
		}
		tok, err := trust.ReadToken(tokenFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil
		case err != nil:
			return err
		}
		apiHTTP = nodes.TokenClient(tok)
		return nil
	}
	id, err := trust.Load(dir, trust.ClientName)
	if err != nil {
		return err
	}
	apiHTTP = nodes.HTTPClient(id)
	return nil
}

// api is a client of the node whose HTTP API is at addr.
func api(addr string) *nodes.Client { return nodes.NewClientWith(addr, apiHTTP) }

// nodeIdentity loads a node's identity for join: NAME.crt in dir, or nil
// if dir has none (the node then needs --insecure beyond loopback).
func nodeIdentity(dir, name string) (*trust.Identity, error) {
	if _, err := os.Stat(filepath.Join(dir, name+".crt")); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return trust.Load(dir, name)
}
