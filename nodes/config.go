package nodes

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/portrange"
	"github.com/ppnode/ppnode/trust"
)

// Defaults of [Config].
const (
	DefaultBind       = "127.0.0.1:7946"
	DefaultHTTP       = "127.0.0.1:0"
	DefaultProfileFor = 300 * time.Millisecond
	// StopGrace is how long Close and Leave wait for the jobs this node
	// coordinates to stop.
	StopGrace = 10 * time.Second
	// CheckpointsKept is how many checkpoints per job the store keeps.
	CheckpointsKept = 3
)

// Config configures an [Agent].
type Config struct {
	// Name is the node's name in the cluster (required, unique).
	Name string
	// Bind is the gossip host:port (default DefaultBind; port 0: the
	// kernel picks).
	Bind string
	// Seeds are gossip addresses of nodes already in the cluster; none
	// starts a new cluster.
	Seeds []string
	// Advertise is the gossip host:port others reach this node at
	// (default: the bound address).
	Advertise string
	// ActorBind is the actor system's host:port (default: Bind's host,
	// port 0). The stage data plane listens on the same host.
	ActorBind string
	// HTTP is the API's host:port (default DefaultHTTP).
	HTTP string
	// DataPorts, if not zero, is the TCP ports the stage links and the
	// link probe listen on (otherwise any: the system picks).
	DataPorts portrange.Range
	// DataDir holds the local checkpoint store (DataDir/checkpoints);
	// empty: no store. One node process at a time may use it (Start
	// takes a lock on DataDir/lock until the node stops).
	DataDir string
	// SecretFile is a gossip encryption key file (see
	// cluster.ReadKeyFile; readable by its owner only); empty: the
	// Identity's gossip key, or gossip in the clear without one.
	SecretFile string
	// Identity is the node's cluster identity (trust.Load): with it the
	// HTTP API, the actor port and the data plane authenticate their
	// peers with the cluster's CA and key (SECURITY.md).
	Identity *trust.Identity
	// TokenFile, for a node without an Identity, holds the local token
	// every HTTP request must carry, made there on the first start
	// (trust.LocalToken); the node sends it to the other nodes too, which
	// must share it. Start reads it into Token.
	TokenFile string
	// Token is the local token; empty (no TokenFile): requests need
	// nothing (in-process tests).
	Token string
	// Files is the directory a job's model, data and init files must be
	// in, opened without following symbolic links out of it (job.Confine);
	// empty: any path the node's user may read (in-process tests).
	Files string
	// Insecure allows a node without an Identity to listen beyond
	// loopback (Start refuses otherwise); it logs a warning.
	Insecure bool
	// EncryptData sends tensors between stages over TLS (with an
	// Identity); otherwise links authenticate their ends and every
	// record of bytes, and the tensors cross readable.
	EncryptData bool
	// Pprof serves Go's profiler at /debug/pprof/ (to the cluster's
	// certificates, or anyone without an Identity).
	Pprof bool
	// HTTPTimeout bounds reading a request and writing an answer, and
	// any silence within a checkpoint's transfer (default
	// DefaultHTTPTimeout).
	HTTPTimeout time.Duration
	// Conns bounds the connections of each listening port (the actor
	// port, the data plane's ports together, the link probe's, the HTTP
	// API's), each with a gate of its own (admit; zero fields: admit's
	// defaults).
	Conns admit.Limits
	// Threads is the compute threads of this node (0: all CPUs).
	Threads int
	// Memory bounds the memory the node offers to training, in bytes (0:
	// what the machine or its cgroup has available); the smaller wins.
	Memory int64
	// ProfileFor is how long the GEMM speed is measured at start (default
	// DefaultProfileFor).
	ProfileFor time.Duration
	// Logger receives the agent's logs (default slog.Default());
	// protoactor's and memberlist's go there too, protoactor's at
	// ActorLogLevel and above.
	Logger        *slog.Logger
	ActorLogLevel slog.Level
}

// withDefaults returns c with its defaults filled in (ActorBind: Bind's
// host, port 0), or validate's error.
func (c Config) withDefaults() (Config, error) {
	if c.Bind == "" {
		c.Bind = DefaultBind
	}
	if c.HTTP == "" {
		c.HTTP = DefaultHTTP
	}
	if c.ProfileFor <= 0 {
		c.ProfileFor = DefaultProfileFor
	}
	if c.Threads <= 0 {
		c.Threads = runtime.NumCPU()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HTTPTimeout <= 0 {
		c.HTTPTimeout = DefaultHTTPTimeout
	}
	if err := c.Conns.Validate(); err != nil {
		return Config{}, fmt.Errorf("nodes: %w", err)
	}
	c.Conns = c.Conns.WithDefaults()
	if host, _, err := net.SplitHostPort(c.Bind); err == nil && c.ActorBind == "" {
		c.ActorBind = net.JoinHostPort(host, "0") // a bad Bind is validate's to report
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// validate checks a Config with its defaults filled in: the name, that
// it listens beyond loopback only with credentials or Insecure, that its
// certificate is this node's, and its addresses.
func (c Config) validate() error {
	if err := CheckName(c.Name); err != nil {
		return fmt.Errorf("nodes: %w", err) // the records naming it would be refused
	}
	if err := checkExposure(c, c.Bind, c.HTTP, c.ActorBind, c.Advertise); err != nil {
		return err
	}
	if id := c.Identity; id != nil && id.Name != c.Name {
		return fmt.Errorf("nodes: the certificate is for %q, not %q", id.Name, c.Name)
	}
	if id := c.Identity; id != nil && id.Role != trust.RoleNode {
		return fmt.Errorf("nodes: the certificate of %q is a %s's, not a node's", id.Name, id.Role)
	}
	if _, _, err := net.SplitHostPort(c.Bind); err != nil {
		return fmt.Errorf("nodes: gossip address %q: %w", c.Bind, err)
	}
	if _, _, err := net.SplitHostPort(c.ActorBind); err != nil {
		return fmt.Errorf("nodes: actor address %q: %w", c.ActorBind, err)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("nodes: advertised address %q: %w", c.Advertise, err)
		}
	}
	return nil
}

// addrs are the addresses a node derives from its valid Config.
type addrs struct {
	// actorAdvertise is the actor system's advertised host:port: the
	// advertised host with ActorBind's port if that is fixed, else ""
	// (the bound address).
	actorAdvertise string
	// dataHost is where the data plane listens and peers dial it:
	// ActorBind's host, or the advertised one if that is unspecified.
	dataHost string
	// probeHost is where the link probe server listens: dataHost, or
	// loopback as the data plane does when it is empty.
	probeHost string
}

// addrs derives the addresses of c, which validate accepted.
func (c Config) addrs() addrs {
	actorHost, actorPort, _ := net.SplitHostPort(c.ActorBind)
	d := addrs{dataHost: actorHost}
	if advHost, _, err := net.SplitHostPort(c.Advertise); err == nil {
		if actorPort != "0" {
			d.actorAdvertise = net.JoinHostPort(advHost, actorPort)
		}
		if ip := net.ParseIP(actorHost); actorHost == "" || (ip != nil && ip.IsUnspecified()) {
			d.dataHost = advHost
		}
	}
	d.probeHost = d.dataHost
	if d.probeHost == "" {
		d.probeHost = "127.0.0.1"
	}
	return d
}

// gossipKey reads the gossip encryption key: SecretFile's, else the
// Identity's; nil: gossip in the clear.
func (c Config) gossipKey() ([]byte, error) {
	switch {
	case c.SecretFile != "":
		if err := trust.CheckKeyFile(c.SecretFile); err != nil {
			return nil, fmt.Errorf("nodes: %w", err)
		}
		key, err := cluster.ReadKeyFile(c.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("nodes: %w", err)
		}
		return key, nil
	case c.Identity != nil:
		return c.Identity.Gossip, nil
	}
	return nil, nil
}
