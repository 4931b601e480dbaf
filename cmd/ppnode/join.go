package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/nodes"
	"github.com/ppnode/ppnode/portrange"
)

// readyLine is what join prints on stdout, after "ready ", once the node is
// up; the integration harness parses it.
type readyLine struct {
	Name   string `json:"name"`
	Gossip string `json:"gossip"`
	Actors string `json:"actors"`
	HTTP   string `json:"http"`
	Probe  string `json:"probe"`
}

// joinConfig parses join's command line (its help goes to stdout).
func joinConfig(args []string, stdout io.Writer) (nodes.Config, logOptions, error) {
	fs := newFlagSet("join", "--name NAME [--bind host:port] [--seeds host:port,...] [--http host:port] [flags]")
	var (
		cfg   nodes.Config
		seeds string
		logs  logFlags
	)
	fs.StringVar(&cfg.Name, "name", "", "this node's name in the cluster (required, unique)")
	fs.StringVar(&cfg.Bind, "bind", nodes.DefaultBind, "gossip address, host:port (IP address; port 0: any free port)")
	fs.StringVar(&seeds, "seeds", "", "gossip addresses of nodes already in the cluster, host:port,... (none: start a new cluster)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "gossip address others reach this node at (default: the bound one)")
	fs.StringVar(&cfg.ActorBind, "actor-bind", "", "actor system address, host:port (default: --bind's host, any free port)")
	fs.StringVar(&cfg.HTTP, "http", nodes.DefaultHTTP, "HTTP API address, host:port")
	dataPorts := fs.String("data-ports", "", "TCP ports the stage-to-stage links and link probes listen on, LO-HI, on --actor-bind's host\n"+
		"(default: any free port; give a range a firewall lets through, such as 7950-7999)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory of the node's checkpoint store, which keeps the consistent cuts of its jobs and copies of\n"+
		"other nodes' (coordinator failover needs it); \"none\": no store (default: the user's state directory,\n"+
		"$XDG_STATE_HOME/ppnode/<name>, else $HOME/.local/state/ppnode/<name>)")
	fs.StringVar(&cfg.SecretFile, "secret-file", "", "gossip encryption key file (16, 24 or 32 bytes; raw, hex or base64; mode 0600)\n"+
		"(default: the credentials' gossip.key)")
	creds := credsFlag(fs)
	fs.StringVar(&cfg.TokenFile, "token-file", defaultTokenFile(), "without credentials: "+tokenUsage)
	fs.StringVar(&cfg.Files, "files", "", "the directory jobs' model, data and --init files must be in, reached without a symbolic link\n"+
		"out of it (default: the user's home directory)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "run without cluster credentials beyond loopback: anyone who reaches the node's\n"+
		"ports can disturb its stages, and whoever has the token file (copy it to every node) can submit and cancel jobs (SECURITY.md)")
	fs.BoolVar(&cfg.EncryptData, "encrypt-data", false, "send tensors between stages over TLS (with credentials; otherwise the links\n"+
		"authenticate their ends and every byte, and the tensors cross readable)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the HTTP API")
	fs.DurationVar(&cfg.HTTPTimeout, "http-timeout", nodes.DefaultHTTPTimeout, "the HTTP API's bound on reading a request and writing an answer,\n"+
		"and on any silence within a checkpoint's transfer")
	fs.IntVar(&cfg.Conns.PerIP, "conn-per-ip", admit.DefaultPerIP, "connections in their handshake from one address (IPv6: one /64) that each listening\n"+
		"port holds at once; more are closed as soon as accepted")
	fs.IntVar(&cfg.Conns.Handshakes, "conn-handshakes", admit.DefaultHandshakes, "connections in their handshake, from all addresses, that each listening port holds at once")
	fs.IntVar(&cfg.Conns.Conns, "conn-max", admit.DefaultConns, "connections, in their handshake or past it, that each listening port holds at once")
	fs.DurationVar(&cfg.Conns.Handshake, "handshake-timeout", admit.DefaultHandshake, "time a connection has to complete its handshake (TLS, a link's, an HTTP request's\n"+
		"headers) before it is closed; also the bound on each of this node's link dials")
	fs.IntVar(&cfg.Threads, "threads", 0, "compute threads (default: all CPUs)")
	memory := fs.String("memory", "", "memory this node offers to training, such as 1GiB (default: what the machine or its cgroup has available; the smaller wins)")
	logs.register(fs)
	var lo logOptions
	if err := parseFlags(fs, args, stdout); err != nil {
		return cfg, lo, err
	}
	if fs.NArg() > 0 {
		return cfg, lo, usagef("unexpected argument %q", fs.Arg(0))
	}
	if cfg.Name == "" {
		return cfg, lo, usagef("--name is required")
	}
	ports, err := portrange.Parse(*dataPorts)
	if err != nil {
		return cfg, lo, usagef("--data-ports: %v", err)
	}
	cfg.DataPorts = ports
	if err := nodes.CheckName(cfg.Name); err != nil {
		return cfg, lo, usagef("--name: %v", err) // as every job record holder would say
	}
	id, err := nodeIdentity(*creds, cfg.Name)
	if err != nil {
		return cfg, lo, err
	}
	cfg.Identity = id
	if id == nil && cfg.TokenFile == "" {
		return cfg, lo, usagef("no --token-file (no home directory?): a node without credentials needs one for its local token")
	}
	lo, err = logs.options()
	if err != nil {
		return cfg, lo, err
	}
	if err := cfg.Conns.Validate(); err != nil {
		return cfg, lo, usagef("--conn-per-ip, --conn-handshakes, --conn-max, --handshake-timeout: want 0 (the default) or more")
	}
	if cfg.Threads < 0 {
		return cfg, lo, usagef("--threads %d: want 0 (all CPUs) or more", cfg.Threads)
	}
	if *memory != "" {
		if cfg.Memory, err = balance.ParseBytes(*memory); err != nil || cfg.Memory <= 0 {
			return cfg, lo, usagef("--memory %q: want a size such as 1GiB", *memory)
		}
	}
	if cfg.Files == "" {
		if cfg.Files, err = os.UserHomeDir(); err != nil {
			return cfg, lo, usagef("no default --files directory (%v): give one", err)
		}
	}
	if cfg.Files, err = filepath.Abs(cfg.Files); err != nil {
		return cfg, lo, usagef("--files: %v", err)
	}
	dataDirSet := false
	fs.Visit(func(f *flag.Flag) { dataDirSet = dataDirSet || f.Name == "data-dir" })
	switch {
	case !dataDirSet:
		dir, err := defaultDataDir(cfg.Name)
		if err != nil {
			return cfg, lo, usageError{err}
		}
		cfg.DataDir = dir
	case cfg.DataDir == "none":
		cfg.DataDir = ""
	case cfg.DataDir == "":
		return cfg, lo, usagef(`--data-dir "": give a directory, or "none" for no checkpoint store`)
	}
	for _, s := range strings.Split(seeds, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Seeds = append(cfg.Seeds, s)
		}
	}
	addrs := []struct {
		flag, addr string
		optional   bool
	}{{"--bind", cfg.Bind, false}, {"--advertise", cfg.Advertise, true}, {"--actor-bind", cfg.ActorBind, true}, {"--http", cfg.HTTP, false}}
	for _, s := range cfg.Seeds {
		addrs = append(addrs, struct {
			flag, addr string
			optional   bool
		}{"--seeds", s, false})
	}
	for _, a := range addrs {
		if a.optional && a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return cfg, lo, usagef("%s %q: want host:port", a.flag, a.addr)
		}
	}
	return cfg, lo, nil
}

// defaultDataDir is a node's data dir when --data-dir is not given: a
// directory per node name under the user's state directory
// ($XDG_STATE_HOME if set to an absolute path, else $HOME/.local/state).
func defaultDataDir(name string) (string, error) {
	if name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsFunc(name, unicode.IsControl) {
		return "", fmt.Errorf("--name %q cannot name the default data directory: give --data-dir (or --data-dir none)", name)
	}
	base, err := stateDir()
	if err != nil {
		return "", fmt.Errorf("no default data directory (%v): give --data-dir (or --data-dir none)", err)
	}
	return filepath.Join(base, "ppnode", name), nil
}

// stateDir is the user's state directory: $XDG_STATE_HOME if set to an
// absolute path, else $HOME/.local/state.
func stateDir() (string, error) {
	base := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(base) { // unset, or relative: ignored, as the XDG spec says
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".local", "state")
	}
	return base, nil
}

func runJoin(args []string, stdout, stderr io.Writer) error {
	cfg, lo, err := joinConfig(args, stdout)
	if err != nil {
		return err
	}
	logger := lo.logger(stderr)
	cfg.Logger = logger
	cfg.ActorLogLevel = max(lo.level, slog.LevelWarn) // protoactor is chatty at info

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.DataDir == "" {
		logger.Warn("no data dir (--data-dir none): no checkpoint store, so this node's jobs have no durable cuts and it holds no copies for coordinator failover")
	}
	a, err := nodes.Start(cfg)
	if err != nil {
		return err
	}
	if m, ok := a.MemoryLimit(); ok && os.Getenv("GOMEMLIMIT") == "" {
		// The garbage collector works harder as the heap nears the limit,
		// rather than let it grow to twice what is live and be killed. A
		// tenth is left to what Go does not count (oneDNN's, OpenBLAS's).
		goLimit := m / 10 * 9
		debug.SetMemoryLimit(goLimit)
		logger.Info("Go memory limit set", "bytes", goLimit)
	}
	b, _ := json.Marshal(readyLine{Name: a.Name(), Gossip: a.GossipAddr(), Actors: a.ActorAddr(), HTTP: a.HTTPAddr(), Probe: a.ProbeAddr()})
	fmt.Fprintf(stdout, "ready %s\n", b)

	<-ctx.Done()
	stop() // a second signal kills the process
	logger.Info("leaving the cluster")
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.Leave(lctx); err != nil {
		logger.Warn("leave", "err", err)
	}
	return nil
}

// logFlags are the flags of a long-running command's log on stderr.
type logFlags struct {
	level, format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level on stderr: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log format on stderr: text (key=value pairs) or json (one JSON object a line)")
}

// options checks the flags.
func (l logFlags) options() (logOptions, error) {
	var o logOptions
	if err := o.level.UnmarshalText([]byte(l.level)); err != nil {
		return o, usagef("--log-level %q: want debug, info, warn or error", l.level)
	}
	switch l.format {
	case "text":
	case "json":
		o.json = true
	default:
		return o, usagef("--log-format %q: want text or json", l.format)
	}
	return o, nil
}

// logOptions are a checked level and format of a log.
type logOptions struct {
	level slog.Level
	json  bool
}

// logger returns a logger that writes to w at o's level and in its format.
func (o logOptions) logger(w io.Writer) *slog.Logger {
	ho := &slog.HandlerOptions{Level: o.level}
	if o.json {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}
