package cluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/clock"
)

// Failure-detection defaults, tuned for a LAN or loopback. Measured on
// loopback they detect a crashed member in about 0.8 s; memberlist's own
// LAN defaults take 5-7 s.
const (
	DefaultProbeInterval       = 200 * time.Millisecond
	DefaultProbeTimeout        = 100 * time.Millisecond
	DefaultSuspicionMult       = 2
	DefaultGossipInterval      = 50 * time.Millisecond
	DefaultTCPTimeout          = 2 * time.Second
	DefaultPushPullInterval    = 5 * time.Second
	DefaultDeadNodeReclaimTime = time.Nanosecond
	DefaultConfirmInterval     = 2 * time.Second
	DefaultBindAddr            = "127.0.0.1:0"
)

// defaultWait bounds Leave and SetMeta when their context has no deadline.
const defaultWait = 5 * time.Second

// Config describes one node. The zero value of every field but Name means
// its default (the Default constants).
type Config struct {
	// Name identifies the node in the cluster; it must be unique and is
	// required (memberlist would default to the host name, which every
	// node on one machine shares).
	Name string
	// BindAddr is the IP:port to listen on, TCP and UDP. Port 0 picks a
	// free port; [Node.Addr] reports it. Host 0.0.0.0 (or empty) listens
	// on all interfaces and advertises a private address.
	BindAddr string
	// AdvertiseAddr is the IP:port other nodes reach this node at, if not
	// the bound one (NAT, port forwarding). Port 0: the bound port.
	AdvertiseAddr string
	// Seeds are host:port addresses of nodes to join at start; empty
	// starts a new cluster.
	Seeds []string
	// Meta is the node's initial metadata.
	Meta Meta
	// SecretKey, if set, encrypts and authenticates all gossip with
	// AES-GCM; 16, 24 or 32 bytes (AES-128/192/256). Every node of a
	// cluster needs the same key. See [ReadKeyFile].
	SecretKey []byte
	// Logger receives memberlist's log lines at their levels ([DEBUG],
	// [INFO], [WARN], [ERR]); the handler's level filters them. Nil
	// discards them.
	Logger *slog.Logger

	// ProbeInterval is how often a node probes a random member.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for an ack before asking
	// other members to probe indirectly; less than ProbeInterval.
	ProbeTimeout time.Duration
	// SuspicionMult scales the time a suspected member has to refute
	// before it is declared failed: SuspicionMult x max(1, log10(n)) x
	// ProbeInterval for n members.
	SuspicionMult int
	// GossipInterval is how often a node gossips queued messages.
	GossipInterval time.Duration
	// TCPTimeout bounds a join's or push/pull's TCP exchange.
	TCPTimeout time.Duration
	// PushPullInterval is how often a node syncs its full state with a
	// random member; it repairs anything gossip lost, such as a restarted
	// node that was refused while its old instance still looked alive.
	// memberlist's default is 30 s; a sync of a small cluster is cheap.
	PushPullInterval time.Duration
	// DeadNodeReclaimTime is how long a member must have been failed
	// before a node of the same name at another address (a restart on a
	// new port) may take its place. The default reclaims at once;
	// memberlist's own default, never, refuses such a restart until the
	// dead member is forgotten (30 s later).
	DeadNodeReclaimTime time.Duration

	// Confirm, if set, is asked before a member memberlist declared
	// failed is reported as failed: it should check the member by other
	// means (its actor port) and return nil if it answers. While it
	// answers, the member stays in [Node.Members] and no EventFailed is
	// sent; Confirm is asked again every ConfirmInterval until memberlist
	// sees the member alive again (it refutes) or Confirm returns an
	// error, which reports the failure. The fast defaults above can
	// declare a member failed that is only starved of CPU; this keeps
	// such a false alarm from starting a recovery. Confirm runs on its
	// own goroutine; ctx ends when the node stops.
	Confirm func(ctx context.Context, m Member) error
	// ConfirmInterval is how often Confirm is asked again about a member
	// it vouched for.
	ConfirmInterval time.Duration

	// Transport, if set, carries the gossip instead of UDP and TCP
	// sockets (BindAddr is then ignored): a memberlist.MockNetwork's, for
	// tests in memory. Make all of a network's transports before the
	// first node starts (the network is not safe for concurrent use); they
	// block a sender to a node that has stopped, so crashes need real
	// sockets.
	Transport memberlist.NodeAwareTransport

	// Gate, if set, bounds the connections of the gossip's TCP listener
	// (joins and push/pulls, admit): a flood of them is closed at once
	// rather than held for TCPTimeout each. Not used with Transport.
	Gate *admit.Gate
	// Clock times the Confirm loop and stamps events (default the wall
	// clock; memberlist keeps its own timers).
	Clock clock.Clock

	// observed, if set, is called for every change memberlist reports,
	// from memberlist's goroutines: tests wait on it.
	observed func(Event)
}

func (c Config) withDefaults() Config {
	if c.BindAddr == "" {
		c.BindAddr = DefaultBindAddr
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = DefaultSuspicionMult
	}
	if c.GossipInterval == 0 {
		c.GossipInterval = DefaultGossipInterval
	}
	if c.TCPTimeout == 0 {
		c.TCPTimeout = DefaultTCPTimeout
	}
	if c.PushPullInterval == 0 {
		c.PushPullInterval = DefaultPushPullInterval
	}
	if c.ConfirmInterval == 0 {
		c.ConfirmInterval = DefaultConfirmInterval
	}
	c.Clock = clock.Or(c.Clock)
	if c.DeadNodeReclaimTime == 0 {
		c.DeadNodeReclaimTime = DefaultDeadNodeReclaimTime
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("a node name is required"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ProbeInterval", c.ProbeInterval},
		{"ProbeTimeout", c.ProbeTimeout},
		{"GossipInterval", c.GossipInterval},
		{"TCPTimeout", c.TCPTimeout},
		{"PushPullInterval", c.PushPullInterval},
		{"ConfirmInterval", c.ConfirmInterval},
		{"DeadNodeReclaimTime", c.DeadNodeReclaimTime},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		errs = append(errs, fmt.Errorf("ProbeTimeout %v must be less than ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval))
	}
	if c.SuspicionMult < 1 {
		errs = append(errs, fmt.Errorf("SuspicionMult %d must be at least 1", c.SuspicionMult))
	}
	if c.SecretKey != nil {
		if err := checkKeyLen(len(c.SecretKey)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster: config: %w", err)
	}
	return nil
}

// splitIPPort parses "IP:port" for binding or advertising; an empty host
// becomes def.
func splitIPPort(what, addr, def string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: %s address %q: %v", what, addr, err)
	}
	if host == "" {
		host = def
	}
	if net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("cluster: %s address %q: host must be an IP address", what, addr)
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: %s address %q: bad port", what, addr)
	}
	return host, int(port), nil
}

func checkKeyLen(n int) error {
	switch n {
	case 16, 24, 32:
		return nil
	}
	return fmt.Errorf("%w: %d bytes, want 16, 24 or 32", ErrBadKey, n)
}

// ReadKeyFile reads a gossip encryption key from a file and returns it for
// [Config.SecretKey]. The file holds either
//
//   - the key as text: hex (openssl rand -hex 32) or standard padded
//     base64 (openssl rand -base64 32), surrounding white space ignored;
//     hex is tried first, so a 32-character string that is valid hex is
//     read as a 16-byte hex key;
//   - or the raw key bytes, if the file is exactly 16, 24 or 32 bytes long
//     and is not one of the text forms above (head -c 32 /dev/urandom).
//
// The decoded key must be 16, 24 or 32 bytes (AES-128, -192, -256).
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: key file: %w", err)
	}
	k, err := ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return k, nil
}

// ParseKey decodes a key as [ReadKeyFile] does.
func ParseKey(b []byte) ([]byte, error) {
	text := bytes.TrimSpace(b)
	if k, err := hex.DecodeString(string(text)); err == nil && checkKeyLen(len(k)) == nil {
		return k, nil
	}
	if k, err := base64.StdEncoding.DecodeString(string(text)); err == nil && checkKeyLen(len(k)) == nil {
		return k, nil
	}
	if checkKeyLen(len(b)) == nil {
		return bytes.Clone(b), nil
	}
	return nil, fmt.Errorf("%w: not 16, 24 or 32 bytes, raw, hex or base64 (got %d bytes)", ErrBadKey, len(b))
}
