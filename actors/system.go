package actors

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/ppnode/ppnode/admit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A System is one node's protoactor actor system with remote. It carries
// only control messages: the protobuf types of ppnode.proto,
// each a few hundred bytes; tensors travel over the [dataplane.DataPlane].
//
// It works around these protoactor traps, each found by measurement:
//
//   - Only protobuf (API v2) messages cross the network; protoactor drops
//     anything else silently. [System.Send] and [System.Request] therefore
//     take a [proto.Message] and refuse messages over
//     [Config.MaxMessageBytes].
//   - The endpoint writer batches queued messages into one gRPC message,
//     so its batch size is derived from the gRPC message limit:
//     EndpointWriterBatchSize = MaxGRPCBytes / MaxMessageBytes.
//   - remote.WithDialOptions replaces the default insecure credentials, so
//     they are passed explicitly.
//   - Spawning an unregistered kind through protoactor's activator panics
//     it and kills every actor it spawned before. Every kind is registered
//     at start ([Config.Kinds]), and remote spawns go through ppnode's own
//     spawner actor ([System.Spawn]), which answers an unknown kind
//     with [SpawnStatus_SPAWN_STATUS_UNKNOWN_KIND] instead of panicking.
//     Never use remote.Spawn/SpawnNamed on a ppnode system.
//   - protoactor's default logger prints coloured lines; it is routed
//     through log/slog at [Config.LogLevel].
//   - Upstream remote.Start silences gRPC's logging process-wide and races
//     with the gRPC goroutines of another system in the same process; it
//     also has shutdown races (a send on a closed channel, a nil map). ppnode
//     builds against a patched copy, actors/internal/protoactor-go (see its
//     PATCHES.md), which go.mod substitutes for the upstream module.
//   - remote has no keepalive: liveness comes from memberlist (publish a
//     remote.EndpointTerminatedEvent for a dead member, see
//     [System.Forget]).
type System struct {
	as     *actor.ActorSystem
	remote *remote.Remote

	cfg      Config
	kinds    map[string]*actor.Props
	spawner  *actor.PID
	stopOnce sync.Once

	// owners maps the PID id of every actor the spawner started to the
	// peer that asked for it ("": this node); see [Config.Authorize].
	owners sync.Map
	// refused counts the streams and messages the port refused.
	refused atomic.Uint64
}

// Config configures a [System]. The zero value is usable: it binds
// 127.0.0.1 on a free port, with no kinds, logging to slog.Default() at
// Info (slog.Level's zero value).
type Config struct {
	// Bind is the host:port the gRPC server listens on; default
	// "127.0.0.1:0" (a free port).
	Bind string
	// Advertise is the host:port other nodes reach this one at (passed to
	// remote.WithAdvertisedHost, which takes host:port); default: the
	// address actually bound.
	Advertise string
	// Kinds are the actor kinds this node can spawn for others. Every node
	// registers every kind at start.
	Kinds map[string]*actor.Props
	// Logger receives protoactor's log lines (default slog.Default()), at
	// LogLevel and above.
	Logger   *slog.Logger
	LogLevel slog.Level
	// MaxMessageBytes bounds one control message (default 64 KiB).
	MaxMessageBytes int
	// MaxGRPCBytes is gRPC's send and receive limit for one batch of
	// messages (default 16 MiB; gRPC's own default is 4 MiB).
	MaxGRPCBytes int
	// ServerTLS and ClientTLS, when set, secure the gRPC port with mutual
	// TLS: the server's config should require client certificates of the
	// cluster, the client's present this node's. Unset: plaintext, and
	// anyone who reaches the port can spawn actors.
	ServerTLS, ClientTLS *tls.Config
	// Gate bounds the gRPC port's connections (default: a gate of its
	// own with admit's default limits). A connection's handshake ends
	// when its peer has sent gRPC's client preface over TLS (or
	// plaintext).
	Gate *admit.Gate
	// Authorize, when set (with ServerTLS), decides who may use the port:
	// it is given the TLS state of each incoming stream and returns the
	// peer's name, or an error that refuses the stream. The messages of a
	// stream it admits are then checked one by one ([System.admit]): the
	// spawner takes only pings and spawns, protoactor's activator nothing,
	// and an actor the spawner started only messages from the peer that
	// asked for it.
	Authorize func(cs *tls.ConnectionState) (peer string, err error)
	// Member, if set (with Authorize), reports whether an authorised peer
	// is known as a member of the cluster: the spawner refuses the spawns
	// of others (a certificate alone does not make a member). It must be
	// safe for concurrent use and must not block.
	Member func(peer string) bool
}

// Defaults of [Config].
const (
	DefaultBind            = "127.0.0.1:0"
	DefaultMaxMessageBytes = 64 << 10
	DefaultMaxGRPCBytes    = 16 << 20
	// SpawnerName is the name of every node's spawner actor.
	SpawnerName = "ppnode-spawner"
)

// JobMessage is a control message of a job: it carries the job id and the
// plan generation.
type JobMessage interface {
	proto.Message
	GetHeader() *Header
}

// Start starts an actor system with remote, registers cfg.Kinds and the
// spawner, and returns once the server listens.
func Start(cfg Config) (*System, error) {
	if cfg.Bind == "" {
		cfg.Bind = DefaultBind
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.MaxGRPCBytes <= 0 {
		cfg.MaxGRPCBytes = DefaultMaxGRPCBytes
	}
	// Each message in a batch also costs its envelope (type id, target and
	// sender indices, header); 1 KiB of slack per message covers it.
	batch := cfg.MaxGRPCBytes / (cfg.MaxMessageBytes + 1<<10)
	if batch < 1 {
		return nil, fmt.Errorf("actors: MaxGRPCBytes %d is smaller than one message (%d bytes)", cfg.MaxGRPCBytes, cfg.MaxMessageBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, portStr, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("actors: bind address %q: %w", cfg.Bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("actors: bind port %q: %w", portStr, err)
	}
	if cfg.Advertise != "" {
		if _, _, err := net.SplitHostPort(cfg.Advertise); err != nil {
			return nil, fmt.Errorf("actors: advertised address %q must be host:port: %w", cfg.Advertise, err)
		}
	}
	if cfg.Gate == nil {
		cfg.Gate = admit.NewGate(admit.Limits{}, nil)
	}
	ln, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("actors: %w", err)
	}

	logger := slog.New(levelHandler{cfg.Logger.Handler(), cfg.LogLevel})
	as := actor.NewActorSystem(actor.WithLoggerFactory(func(s *actor.ActorSystem) *slog.Logger {
		return logger.With(slog.String("lib", "protoactor"), slog.String("system", s.ID))
	}))

	s := &System{as: as, cfg: cfg, kinds: make(map[string]*actor.Props, len(cfg.Kinds))}
	var kinds []*remote.Kind
	for name, props := range cfg.Kinds {
		if props == nil {
			ln.Close()
			return nil, fmt.Errorf("actors: kind %q has nil props", name)
		}
		s.kinds[name] = props
		kinds = append(kinds, remote.NewKind(name, props))
	}

	clientCreds, serverCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if (cfg.ServerTLS == nil) != (cfg.ClientTLS == nil) {
		ln.Close()
		return nil, errors.New("actors: ServerTLS and ClientTLS go together")
	}
	if cfg.ServerTLS != nil {
		clientCreds, serverCreds = credentials.NewTLS(cfg.ClientTLS), credentials.NewTLS(cfg.ServerTLS)
	}
	serverOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.MaxGRPCBytes), grpc.MaxSendMsgSize(cfg.MaxGRPCBytes),
		grpc.Creds(prefaced{serverCreds}), grpc.ConnectionTimeout(cfg.Gate.Limits().Handshake)}
	if cfg.Authorize != nil && cfg.ServerTLS == nil {
		ln.Close()
		return nil, errors.New("actors: Authorize needs ServerTLS")
	}
	// ppnode uses only the Receive stream; protoactor's unary methods
	// panic ("implement me"), which would take the node down.
	serverOpts = append(serverOpts, grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		s.refused.Add(1)
		return nil, status.Error(codes.Unimplemented, "actors: no unary calls on this port")
	}))
	opts := []remote.ConfigOption{
		remote.WithKinds(kinds...),
		remote.WithEndpointWriterBatchSize(batch),
		// The queue of messages to one remote node starts small and grows
		// as needed; upstream's starts at a million entries, 16 MB for
		// every node this one has talked to, restarted nodes included.
		remote.WithEndpointWriterQueueSize(1024),
		// One connection attempt: a node that refuses is gone (memberlist
		// and the coordinator's re-planning take it from there); upstream
		// retried 5 times, 2 s apart, blocking its endpoint writer.
		remote.WithMaxRetryCount(1),
		// WithDialOptions replaces the default grpc.WithInsecure().
		remote.WithDialOptions(
			grpc.WithTransportCredentials(clientCreds),
			grpc.WithDefaultCallOptions(
				grpc.MaxCallRecvMsgSize(cfg.MaxGRPCBytes),
				grpc.MaxCallSendMsgSize(cfg.MaxGRPCBytes),
			),
		),
		remote.WithServerOptions(serverOpts...),
		remote.WithListener(cfg.Gate.Listen(ln)),
	}
	if cfg.Advertise != "" {
		opts = append(opts, remote.WithAdvertisedHost(cfg.Advertise))
	}
	if cfg.Authorize != nil {
		opts = append(opts, remote.WithInbound(&remote.Inbound{Authorize: s.authorize, Admit: s.admit}))
	}
	s.remote = remote.NewRemote(as, remote.Configure(host, port, opts...))
	if err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("actors: starting remote: %v", r)
			}
		}()
		s.remote.Start()
		return nil
	}(); err != nil {
		as.Shutdown()
		return nil, err
	}

	s.spawner, err = as.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor {
		return &spawner{sys: s, gens: map[string]uint64{}}
	}), SpawnerName)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("actors: starting spawner: %w", err)
	}
	return s, nil
}

// Address is the host:port other nodes reach this system at.
func (s *System) Address() string { return s.as.Address() }

// Stop shuts the remote down (gracefully: pending writes are flushed,
// streams closed) and then the actor system. It is idempotent.
func (s *System) Stop() {
	s.stopOnce.Do(func() {
		if s.spawner != nil {
			_ = s.as.Root.StopFuture(s.spawner).Wait()
		}
		s.remote.Shutdown(true)
		s.as.Shutdown()
	})
}

// ErrTooLarge says a message exceeds [Config.MaxMessageBytes]; such
// payloads belong on the data plane.
var ErrTooLarge = errors.New("actors: control message too large")

func (s *System) check(msg proto.Message) error { return checkMessage(msg, s.cfg.MaxMessageBytes) }

// checkMessage refuses a nil message or one over limit bytes.
func checkMessage(msg proto.Message, limit int) error {
	if msg == nil {
		return errors.New("actors: nil message")
	}
	if n := proto.Size(msg); n > limit {
		return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrTooLarge, proto.MessageName(msg), n, limit)
	}
	return nil
}

// Send sends msg to a stage without waiting.
func (s *System) Send(to StageRef, msg proto.Message) error {
	if err := s.check(msg); err != nil {
		return err
	}
	s.as.Root.Send(to.pid(), msg)
	return nil
}

// Request sends msg to a stage and waits up to timeout for the reply.
func (s *System) Request(to StageRef, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	return s.request(to.pid(), msg, timeout)
}

// request sends msg to pid and waits up to timeout for the reply. A reply
// that is not a protobuf message is an error.
func (s *System) request(pid *actor.PID, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	if err := s.check(msg); err != nil {
		return nil, err
	}
	res, err := s.as.Root.RequestFuture(pid, msg, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: request %s to %s: %w", proto.MessageName(msg), pid, err)
	}
	reply, ok := res.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("actors: request %s to %s: reply %T is not a protobuf message", proto.MessageName(msg), pid, res)
	}
	return reply, nil
}

// SpawnError is a spawn refused by the remote node.
type SpawnError struct {
	Address string
	Kind    string
	Status  SpawnStatus
	Text    string
}

func (e *SpawnError) Error() string {
	return fmt.Sprintf("actors: spawn %q on %s: %s: %s", e.Kind, e.Address, e.Status, e.Text)
}

// Spawn asks the spawner at address (host:port of a ppnode System;
// s.Address() for this node) to start an actor of req.Kind and returns a
// reference to it. A refusal is a [*SpawnError] with the remote status.
func (s *System) Spawn(address string, req *SpawnStage, timeout time.Duration) (StageRef, error) {
	res, err := s.request(actor.NewPID(address, SpawnerName), req, timeout)
	if err != nil {
		return StageRef{}, err
	}
	return spawned(address, req, res)
}

// spawned reads a spawner's reply.
func spawned(address string, req *SpawnStage, res proto.Message) (StageRef, error) {
	rep, ok := res.(*SpawnStageReply)
	if !ok {
		return StageRef{}, fmt.Errorf("actors: spawn %q on %s: unexpected reply %s", req.GetKind(), address, proto.MessageName(res))
	}
	if rep.GetStatus() != SpawnStatus_SPAWN_STATUS_OK {
		return StageRef{}, &SpawnError{Address: address, Kind: req.GetKind(), Status: rep.GetStatus(), Text: rep.GetError()}
	}
	if rep.GetPidAddress() == "" || rep.GetPidId() == "" {
		return StageRef{}, fmt.Errorf("actors: spawn %q on %s: reply without a PID", req.GetKind(), address)
	}
	return StageRef{Addr: rep.GetPidAddress(), ID: rep.GetPidId()}, nil
}

// pingRedial is how often Ping checks, while it waits for the answer,
// that the node's port still accepts connections.
const pingRedial = 50 * time.Millisecond

// Ping asks the node at address whether its actor system answers within
// timeout. A node whose port refuses connections (its process is gone)
// fails at once: the request alone would wait out the timeout, as remote
// does not fail a request whose endpoint cannot connect. A process that
// is being killed still accepts connections for a few milliseconds while
// it exits, so the port is tried again every pingRedial until the answer
// comes: a refusal then ends the wait too. So does ctx ending, with its
// error.
func (s *System) Ping(ctx context.Context, address string, timeout time.Duration) error {
	dial := func(timeout time.Duration) error {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, "tcp", address)
		if err != nil {
			return fmt.Errorf("actors: ping %s: %w", address, err)
		}
		conn.Close()
		return nil
	}
	if err := dial(timeout); err != nil {
		return err
	}
	type answer struct {
		r   proto.Message
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := s.request(actor.NewPID(address, SpawnerName), &Ping{Nonce: 1}, timeout)
		ch <- answer{r, err}
	}()
	tick := time.NewTicker(pingRedial)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("actors: ping %s: %w", address, ctx.Err())
		case a := <-ch:
			if a.err != nil {
				return a.err
			}
			if _, ok := a.r.(*Pong); !ok {
				return fmt.Errorf("actors: ping %s: unexpected reply %s", address, proto.MessageName(a.r))
			}
			return nil
		case <-tick.C:
			// Only a refusal counts: a slow dial is no answer yet.
			if err := dial(pingRedial); errors.Is(err, syscall.ECONNREFUSED) {
				return err
			}
		}
	}
}

// Forget tells the remote that the node at address is gone (memberlist
// reported it dead, or it does not answer): its endpoint is dropped and
// actors watching PIDs there receive Terminated. remote has no keepalive
// of its own, and would keep redialling it.
func (s *System) Forget(address string) {
	s.as.EventStream.Publish(&remote.EndpointTerminatedEvent{Address: address})
}

// admitSpawn answers a spawn request that cannot be served: a kind not
// known on the node at addr, or a generation older than the newest the
// node has spawned for the job (gens, which it updates otherwise). An
// admitted request gets a reply with status OK to fill in.
func admitSpawn(gens map[string]uint64, req *SpawnStage, known bool, addr string) *SpawnStageReply {
	rep := &SpawnStageReply{Header: req.GetHeader()}
	job, gen := req.GetHeader().GetJobId(), req.GetHeader().GetGeneration()
	switch {
	case !known:
		rep.Status = SpawnStatus_SPAWN_STATUS_UNKNOWN_KIND
		rep.Error = fmt.Sprintf("kind %q is not registered on %s", req.GetKind(), addr)
	case gen < gens[job]:
		rep.Status = SpawnStatus_SPAWN_STATUS_STALE
		rep.Error = fmt.Sprintf("job %q generation %d is older than %d", job, gen, gens[job])
	default:
		gens[job] = gen
	}
	return rep
}

// spawner starts actors of registered kinds for other nodes. Unlike
// protoactor's activator it never panics: an unknown kind, a taken name or
// a stale generation is a status in the reply.
type spawner struct {
	sys  *System
	gens map[string]uint64 // newest plan generation seen per job
}

func (sp *spawner) Receive(c actor.Context) {
	if p, ok := c.Message().(*Ping); ok { // liveness probe (see System.Ping)
		c.Respond(&Pong{Header: p.GetHeader(), Nonce: p.GetNonce(), Address: sp.sys.Address()})
		return
	}
	if t, ok := c.Message().(*actor.Terminated); ok { // a child stopped
		sp.sys.owners.Delete(t.GetWho().GetId())
		return
	}
	req, ok := c.Message().(*SpawnStage)
	if !ok {
		return
	}
	props, known := sp.sys.kinds[req.GetKind()]
	if peer, member := peerOf(c), sp.sys.cfg.Member; peer != "" && member != nil && !member(peer) {
		// Before the generation is recorded: a stranger's spawn must not
		// make the coordinator's stale.
		sp.sys.refused.Add(1)
		c.Respond(&SpawnStageReply{Header: req.GetHeader(), Status: SpawnStatus_SPAWN_STATUS_ERROR,
			Error: fmt.Sprintf("%q is not a member of the cluster as %s knows it", peer, sp.sys.Address())})
		return
	}
	rep := admitSpawn(sp.gens, req, known, sp.sys.Address())
	if rep.Status == SpawnStatus_SPAWN_STATUS_OK {
		var pid *actor.PID
		var err error
		if req.GetName() == "" {
			pid = c.Spawn(props)
		} else {
			pid, err = c.SpawnNamed(props, req.GetName())
		}
		switch {
		case errors.Is(err, actor.ErrNameExists):
			rep.Status = SpawnStatus_SPAWN_STATUS_NAME_EXISTS
			rep.Error = fmt.Sprintf("name %q is taken", req.GetName())
		case err != nil:
			rep.Status = SpawnStatus_SPAWN_STATUS_ERROR
			rep.Error = err.Error()
		default:
			rep.PidAddress, rep.PidId = pid.GetAddress(), pid.GetId()
			sp.sys.owners.Store(pid.GetId(), peerOf(c))
		}
	}
	c.Respond(rep)
}

// authorize is the remote's check of a new stream on the port: the peer
// the TLS handshake verified must pass [Config.Authorize].
func (s *System) authorize(ctx context.Context) (string, error) {
	var cs *tls.ConnectionState
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cs = &info.State
		}
	}
	name, err := s.cfg.Authorize(cs)
	if err != nil {
		s.refused.Add(1)
	}
	return name, err
}

// admit is the remote's check of each message of an authorised stream
// from peer: the spawner takes pings and spawns, protoactor's activator
// (which would spawn without ppnode's checks) nothing, and an actor the
// spawner started only the messages of the peer that asked for it: its
// job's coordinator. Other targets (the futures and actors of this
// node's own requests and coordinators) take what comes.
func (s *System) admit(peer string, target *actor.PID, msg any) bool {
	ok := true
	switch id := target.GetId(); id {
	case SpawnerName:
		switch msg.(type) {
		case *Ping, *SpawnStage:
		default:
			ok = false
		}
	case remoteActivator:
		ok = false
	default:
		if owner, started := s.owners.Load(id); started && owner != peer {
			ok = false
		}
	}
	if !ok {
		s.refused.Add(1)
		s.as.Logger().Warn("actors: refused a message", "from", peer, "to", target.GetId(), "type", fmt.Sprintf("%T", msg))
	}
	return ok
}

// remoteActivator is the name of protoactor's activator actor.
const remoteActivator = "activator"

// peerOf is the peer the remote authorised for the message c handles
// ("": sent from this node).
func peerOf(c actor.Context) string {
	if h := c.MessageHeader(); h != nil {
		return h.Get(remote.PeerHeader)
	}
	return ""
}

// Refused counts the streams, calls and messages the port refused.
func (s *System) Refused() uint64 { return s.refused.Load() }

// Gate applies the plan-generation rule of one job: messages of another
// job, or of an older generation than the current one, are dropped and
// counted. Use it from one actor (its methods are safe for concurrent use
// so that tests and status pages may read the counters).
type Gate struct {
	job     string
	gen     atomic.Uint64
	dropped atomic.Uint64
}

// NewGate returns a gate for job at generation gen.
func NewGate(job string, gen uint64) *Gate {
	g := &Gate{job: job}
	g.gen.Store(gen)
	return g
}

// Admit reports whether msg belongs to the gate's job and current (or a
// newer) generation; otherwise it counts msg as dropped.
func (g *Gate) Admit(msg JobMessage) bool {
	h := msg.GetHeader()
	if h == nil || h.GetJobId() != g.job || h.GetGeneration() < g.gen.Load() {
		g.dropped.Add(1)
		return false
	}
	return true
}

// Advance moves the gate to generation gen (a new plan); it never goes
// back.
func (g *Gate) Advance(gen uint64) {
	for {
		cur := g.gen.Load()
		if gen <= cur || g.gen.CompareAndSwap(cur, gen) {
			return
		}
	}
}

// Generation is the gate's current generation.
func (g *Gate) Generation() uint64 { return g.gen.Load() }

// Dropped counts the messages the gate refused.
func (g *Gate) Dropped() uint64 { return g.dropped.Load() }

// levelHandler passes records at level and above to h.
type levelHandler struct {
	h     slog.Handler
	level slog.Leveler
}

func (l levelHandler) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.level.Level() && l.h.Enabled(ctx, lv)
}

func (l levelHandler) Handle(ctx context.Context, r slog.Record) error { return l.h.Handle(ctx, r) }

func (l levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{l.h.WithAttrs(attrs), l.level}
}

func (l levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{l.h.WithGroup(name), l.level}
}
