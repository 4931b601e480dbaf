package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
	"google.golang.org/protobuf/proto"
)

// StageKind is the actor kind of a pipeline stage; every node registers it
// at start (see [StageProps]).
const StageKind = "ppnode.stage"

// StageHost is what a node lends the stages it hosts.
type StageHost struct {
	DataPlane dataplane.DataPlane
	// Threads is the node's compute threads (0: all CPUs), used unless a
	// job sets its own.
	Threads int
	Logger  *slog.Logger
	// Capacity, if set, returns the GEMM speed (GFLOP/s) the node's CPU
	// limit allows now and the CPUs it leaves the node's threads, 0 and 0
	// without a limit; stages report them with their timings every step.
	Capacity func() (gflops, cpus float64)
	// Files, if set, is the directory a job's files must be in and are
	// read from: a stage whose spec names one outside it is refused.
	Files *job.Files
	// HandshakeTimeout bounds each data-plane link's dial and handshake
	// (0: the data plane's default).
	HandshakeTimeout time.Duration

	mu       sync.Mutex               // guards stages, idle, closing, handoffs and turns
	stages   map[*stageActor]struct{} // set up and not yet shut down
	idle     chan struct{}            // closed while no stage runs; nil until the first stage
	closing  bool                     // Close was called: no new stage
	handoffs map[handoffKey]*handoff
	turns    map[turnKey]*turn // the executors of nodes that hold several stages of a plan
}

// stageUp counts a stage that is set up, unless the host is closing.
func (h *StageHost) stageUp(a *stageActor) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return errHostClosing
	}
	if h.stages == nil {
		h.stages = map[*stageActor]struct{}{}
	}
	h.stages[a] = struct{}{}
	if h.idle == nil || len(h.stages) == 1 {
		h.idle = make(chan struct{})
	}
	return nil
}

func (h *StageHost) stageDown(a *stageActor) {
	h.mu.Lock()
	delete(h.stages, a)
	if len(h.stages) == 0 {
		close(h.idle)
	}
	h.mu.Unlock()
}

var (
	errHostClosing = errors.New("the node is stopping")
	errAbandoned   = errors.New("the step was abandoned: the job moves to a new plan")
)

// Refuse makes the host set up no new stage: the node is stopping. Its
// stages run on (a leaving node's until their jobs move them away).
func (h *StageHost) Refuse() {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
}

// Close stops the host's stages and takes no new ones: each frees what it
// holds (its links break, so their jobs recover elsewhere). It waits until
// they have, or ctx ends. A node calls it before stopping its actor system,
// which would leave them running.
func (h *StageHost) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	for a := range h.stages {
		a.post(hostClosing{})
	}
	h.mu.Unlock()
	return h.WaitIdle(ctx)
}

// hostClosing is the message Close sends a stage.
type hostClosing struct{}

// WaitIdle waits until the host runs no stage (a leaving node lets its
// stages be moved away first) or ctx ends.
func (h *StageHost) WaitIdle(ctx context.Context) error {
	h.mu.Lock()
	idle := h.idle
	busy := len(h.stages) > 0
	h.mu.Unlock()
	if !busy {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StageProps returns the props of the stage kind for a node.
func StageProps(h *StageHost) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &stageActor{host: h} })
}

// stageActor owns one stage of one job: it sets the stage up, connects its
// links, and runs steps, weight gathers and state moves one at a time on a
// goroutine of its own, so that its mailbox stays free for StopStage.
type stageActor struct {
	host *StageHost
	// post sends the stage a message of its own (from another goroutine).
	post    func(any)
	gate    *Gate
	eng     *stageEngine
	lns     []dataplane.Listener
	accepts chan acceptResult
	busy    chan struct{} // closed when the running step ends; nil when idle
	// migLns listen for the links that bring the state of the stage's
	// layers from the previous plan's stages (spec.Sources); migAccepts
	// yields their links, once.
	migLns     []dataplane.Listener
	migAccepts chan acceptResult
	quit       chan struct{} // closed by shutdown: a running move gives up
	stopped    bool          // shut down: set up no more
}

type acceptResult struct {
	from int
	lk   dataplane.Link
	err  error
}

func (a *stageActor) log() *slog.Logger {
	if a.host.Logger != nil {
		return a.host.Logger
	}
	return slog.Default()
}

// Receive makes a stage a protoactor actor: its replies go to the sender
// of the message being handled (later, for the work it runs on its own
// goroutine), its messages to itself through the actor system.
func (a *stageActor) Receive(c actor.Context) {
	switch c.Message().(type) {
	case *actor.Started:
		self, root := c.Self(), c.ActorSystem().Root
		a.post = func(m any) { root.Send(self, m) }
		return
	case *actor.Stopping:
		a.shutdown()
		return
	}
	sender, root := c.Sender(), c.ActorSystem().Root
	reply := func(m proto.Message) {
		if sender != nil {
			root.Send(sender, m)
		}
	}
	if a.handle(c.Message(), reply) {
		// After the messages already queued, which a stopped stage
		// answers at once: a request that crossed the stop gets a reply.
		c.Poison(c.Self())
	}
}

// handle handles one message; reply answers its sender, now or later. It
// reports whether the stage has stopped.
func (a *stageActor) handle(m any, reply func(proto.Message)) (stopped bool) {
	switch msg := m.(type) {
	case *SetupStage:
		reply(a.setup(msg))
	case coordinatorGone:
		a.log().Warn("the link to the coordinator broke; the stage stops", "err", msg.err)
		a.shutdown()
		return true
	case hostClosing:
		a.shutdown()
		return true
	case *ConnectStage:
		if !a.admit(msg, reply) {
			return false
		}
		reply(ack(msg.GetHeader(), a.connect(msg)))
	case *StepBegin:
		if !a.admit(msg, reply) {
			return false
		}
		for peer, r := range msg.GetLinkRates() {
			if p := a.eng.peers[int(peer)]; p != nil {
				p.lk.SetRate(r)
			}
		}
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			res, err := a.eng.step(int(msg.GetStep()), msg.GetLr(), msg.GetMass())
			t := &StageTiming{Stage: int32(a.eng.spec.Plan.ID), ForwardNs: res.forwardNs, BackwardNs: res.backwardNs, UpdateNs: res.updateNs, WaitNs: res.waitNs, WallNs: res.wallNs,
				Links: a.eng.sent(), Passes: res.passes}
			if a.host.Capacity != nil {
				t.CapacityGflops, t.Cpus = a.host.Capacity()
			}
			t.CpuNs = res.cpuNs
			d := &StepDone{Header: msg.GetHeader(), Step: msg.GetStep(), Timings: []*StageTiming{t},
				Loss: res.loss, HasLoss: a.eng.spec.Plan.Loss, Correct: res.correct, Samples: res.samples,
				GradNames: res.gradNames, GradSumsq: res.gradSumsq}
			if err != nil {
				d.Error = err.Error()
			}
			return d
		})
	case *EvalBegin:
		if !a.admit(msg, reply) {
			return false
		}
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			res, err := a.eng.evaluate(int(msg.GetStep()), int(msg.GetChunks()), int(msg.GetWindow()))
			t := &StageTiming{Stage: int32(a.eng.spec.Plan.ID), ForwardNs: res.forwardNs, WaitNs: res.waitNs, WallNs: res.wallNs}
			d := &StepDone{Header: msg.GetHeader(), Step: msg.GetStep(), Timings: []*StageTiming{t}, HasLoss: a.eng.spec.Plan.Loss,
				Correct: res.correct, Samples: res.samples, ChunkLoss: res.losses}
			if err != nil {
				d.Error = err.Error()
			}
			return d
		})
	case *ClipGrads:
		if !a.admit(msg, reply) {
			return false
		}
		if a.busy != nil {
			select {
			case <-a.busy:
			default:
				reply(ack(msg.GetHeader(), errors.New("stage is busy")))
				return false
			}
		}
		reply(ack(msg.GetHeader(), a.eng.setClip(int(msg.GetStep()), msg.GetScale())))
	case *GatherWeights:
		if !a.admit(msg, reply) {
			return false
		}
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			d := &StepDone{Header: msg.GetHeader()}
			if err := a.eng.gather(msg.GetOptimizer()); err != nil {
				d.Error = err.Error()
			}
			return d
		})
	case *RestoreStage:
		if !a.admit(msg, reply) {
			return false
		}
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			d := &StepDone{Header: msg.GetHeader()}
			if err := a.eng.restore(msg.GetSteps()); err != nil {
				d.Error = err.Error()
			}
			return d
		})
	case *SendState:
		if !a.admit(msg, reply) {
			return false
		}
		// The job moves to a newer plan: this stage only hands its state
		// over from now on, and a step it still runs (one that failed
		// elsewhere) is abandoned.
		a.gate.Advance(msg.GetHeader().GetGeneration())
		if a.busy != nil {
			a.eng.abort(errAbandoned)
			<-a.busy
		}
		quit := a.quit
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			if err := a.eng.settle(int(msg.GetSteps())); err != nil {
				return stateMoved(msg.GetHeader(), nil, err)
			}
			stats, err := a.sendState(msg, quit)
			return stateMoved(msg.GetHeader(), stats, err)
		})
	case *ReceiveState:
		if !a.admit(msg, reply) {
			return false
		}
		accepts, quit := a.migAccepts, a.quit
		a.migAccepts = nil
		a.runAsync(msg.GetHeader(), reply, func() proto.Message {
			stats, err := a.receiveState(msg, accepts, quit)
			return stateMoved(msg.GetHeader(), stats, err)
		})
	case *StopStage:
		a.shutdown()
		reply(ack(msg.GetHeader(), nil))
		return true
	}
	return false
}

// coordinatorGone is the message a stage sends itself when its link to
// the coordinator breaks: the coordinator or its node is gone (a new
// coordinator builds new stages), so the stage frees what it holds.
type coordinatorGone struct{ err error }

func (a *stageActor) coordinatorLost(err error) { a.post(coordinatorGone{err}) }

// admit answers messages the stage cannot take: before setup, or of
// another job or an older plan (those are dropped, as the plan rule says).
func (a *stageActor) admit(msg JobMessage, reply func(proto.Message)) bool {
	if a.eng == nil {
		reply(refusal(msg, "stage is not set up"))
		return false
	}
	if !a.gate.Admit(msg) {
		h := msg.GetHeader()
		a.log().Debug("stage drops a message of another job or plan", "job", h.GetJobId(), "generation", h.GetGeneration())
		if h.GetJobId() == a.eng.spec.Job.ID() {
			// An older plan's request: its sender hears now rather than
			// when it gives up waiting.
			reply(refusal(msg, fmt.Sprintf("stage is at generation %d (a newer plan), the request of %d", a.gate.Generation(), h.GetGeneration())))
		}
		return false
	}
	return true
}

// refusal is the reply to a request the stage does not run, of the type
// its sender waits for.
func refusal(msg JobMessage, why string) proto.Message {
	switch msg.(type) {
	case *ConnectStage, *ClipGrads:
		return &Ack{Header: msg.GetHeader(), Error: why}
	case *SendState, *ReceiveState:
		return stateMoved(msg.GetHeader(), nil, errors.New(why))
	}
	return &StepDone{Header: msg.GetHeader(), Error: why} // StepBegin, EvalBegin, GatherWeights, RestoreStage
}

func ack(h *Header, err error) *Ack {
	if err != nil {
		return &Ack{Header: h, Error: err.Error()}
	}
	return &Ack{Header: h, Ok: true}
}

func (a *stageActor) setup(msg *SetupStage) *SetupStageReply {
	rep := &SetupStageReply{Header: msg.GetHeader()}
	if a.eng != nil || a.stopped {
		rep.Error = "stage is already set up"
		return rep
	}
	spec, err := unmarshalStageSpec(msg.GetSpec())
	if err == nil && (spec.Job.ID() != msg.GetHeader().GetJobId() || spec.Generation != msg.GetHeader().GetGeneration()) {
		err = fmt.Errorf("spec of job %q generation %d in a message of job %q generation %d",
			spec.Job.ID(), spec.Generation, msg.GetHeader().GetJobId(), msg.GetHeader().GetGeneration())
	}
	if err == nil && a.host.Files != nil {
		err = a.host.Files.Check(spec.Job.Spec())
		spec.Job = spec.Job.ReadingFrom(a.host.Files)
	}
	var eng *stageEngine
	if err == nil {
		eng, err = newStageEngine(spec, a.host.Threads)
	}
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	me := spec.Plan.ID
	from := eng.incoming()
	a.accepts = make(chan acceptResult, len(from))
	for _, f := range from {
		ln, err := a.host.DataPlane.Listen(stageHello(spec, f, me), a.linkOptions(spec, f))
		if err != nil {
			a.closeListeners()
			rep.Error = fmt.Sprintf("listen for stage %d: %v", f, err)
			return rep
		}
		a.lns = append(a.lns, ln)
		rep.Listen = append(rep.Listen, &LinkAddr{Link: linkID(f, me), From: int32(f), To: int32(me), Addr: ln.Addr()})
		go func() {
			lk, err := ln.Accept()
			a.accepts <- acceptResult{from: f, lk: lk, err: err}
		}()
	}
	migAccepts := make(chan acceptResult, len(spec.Sources))
	a.migAccepts = migAccepts
	for _, src := range spec.Sources {
		if src.Local {
			continue
		}
		h := dataplane.Hello{JobID: spec.Job.ID(), Generation: spec.Generation, Link: migrateLinkID(src.From, me), From: stageWire(src.From), To: stageWire(me)}
		ln, err := a.host.DataPlane.Listen(h, a.moveOptions(spec))
		if err != nil {
			a.closeListeners()
			a.closeMigrationListeners()
			rep.Error = fmt.Sprintf("listen for the state from stage %d: %v", src.From, err)
			return rep
		}
		a.migLns = append(a.migLns, ln)
		rep.Migrate = append(rep.Migrate, &LinkAddr{Link: h.Link, From: int32(src.From), To: int32(me), Addr: ln.Addr()})
		go func() {
			lk, err := ln.Accept()
			migAccepts <- acceptResult{from: src.From, lk: lk, err: err}
		}()
	}
	for _, p := range eng.params {
		if p.Trainable() {
			rep.Params += int64(p.Value.Shape().TotalSize())
		}
	}
	if len(spec.Turn) > 0 {
		err := checkTurn(spec.Turn, me, len(spec.Plan.Program))
		if err == nil {
			eng.turn, err = a.host.acquireTurn(spec.Job.ID(), spec.Generation, spec.Turn)
		}
		if err != nil {
			a.closeListeners()
			a.closeMigrationListeners()
			eng.close()
			rep.Error = err.Error()
			return rep
		}
	}
	if err := a.host.stageUp(a); err != nil {
		a.closeListeners()
		a.closeMigrationListeners()
		eng.close()
		if eng.turn != nil {
			a.host.releaseTurn(eng.turn)
		}
		rep.Error = err.Error()
		return rep
	}
	a.quit = make(chan struct{})
	a.eng = eng
	a.gate = NewGate(spec.Job.ID(), spec.Generation)
	return rep
}

// linkOptions are the options of the stage's link with peer: its codecs
// chosen for the link's rate, the job's lossy wire format if any.
func (a *stageActor) linkOptions(spec StageSpec, peer int) dataplane.Options {
	js := spec.Job.Spec()
	o := dataplane.Options{IOTimeout: spec.IOTimeout, HandshakeTimeout: a.host.HandshakeTimeout, Auto: js.AutoCodecs(), Rate: spec.Rates[peer], Lossy: js.WireCodec()}
	if o.IOTimeout <= 0 {
		o.IOTimeout = 10 * time.Minute
	}
	return o
}

// moveOptions are the options of the links that move state between plans:
// raw frames (the state is dense), counted as sent.
func (a *stageActor) moveOptions(spec StageSpec) dataplane.Options {
	o := a.linkOptions(spec, balance.Coordinator)
	o.Auto, o.Lossy = false, tensorio.CodecRaw
	return o
}

// stageHello is the handshake of the link from stage from to stage to.
func stageHello(spec StageSpec, from, to int) dataplane.Hello {
	return dataplane.Hello{JobID: spec.Job.ID(), Generation: spec.Generation, Link: linkID(from, to), From: stageWire(from), To: stageWire(to)}
}

// stageWire writes a stage index as the data plane's uint32
// (the coordinator, -1, as MaxUint32).
func stageWire(s int) uint32 {
	if s < 0 {
		return math.MaxUint32
	}
	return uint32(s)
}

// connect dials the links this stage sends on and waits for the ones it
// receives on. Its errors do not name the stage: the coordinator does.
func (a *stageActor) connect(msg *ConnectStage) error {
	if len(a.eng.peers) > 0 {
		return fmt.Errorf("stage is already connected")
	}
	spec := a.eng.spec
	me := spec.Plan.ID
	want := a.eng.outgoing()
	for _, d := range msg.GetDial() {
		to := int(d.GetTo())
		if int(d.GetFrom()) != me || !slices.Contains(want, to) || a.eng.peers[to] != nil {
			return fmt.Errorf("unexpected link %d -> %d", d.GetFrom(), to)
		}
		lk, err := a.host.DataPlane.Dial(d.GetAddr(), stageHello(spec, me, to), a.linkOptions(spec, to))
		if err != nil {
			return fmt.Errorf("link to stage %d: %w", to, err)
		}
		a.eng.attach(to, lk, nil)
	}
	for _, to := range want {
		if a.eng.peers[to] == nil {
			return fmt.Errorf("no address for its link to stage %d", to)
		}
	}
	// Every peer dials as soon as it is told to, and gives up after a
	// dial and a handshake (HandshakeTimeout each): waiting longer only
	// delays a recovery over a link that does not work.
	wait := 2*a.moveOptions(spec).WithDefaults().HandshakeTimeout + 2*time.Second
	deadline := time.After(wait)
	for range a.lns {
		select {
		case r := <-a.accepts:
			if r.err != nil {
				return fmt.Errorf("link from stage %d: %w", r.from, r.err)
			}
			var broken func(error)
			if r.from == balance.Coordinator {
				broken = a.coordinatorLost
			}
			a.eng.attach(r.from, r.lk, broken)
		case <-deadline:
			return fmt.Errorf("its incoming links were not all connected within %v", wait)
		}
	}
	a.closeListeners()
	return nil
}

// runAsync runs f on a goroutine and sends its reply to the requester;
// one at a time.
func (a *stageActor) runAsync(h *Header, reply func(proto.Message), f func() proto.Message) {
	if a.busy != nil {
		select {
		case <-a.busy:
		default:
			reply(&StepDone{Header: h, Error: "stage is busy with a step"})
			return
		}
	}
	if a.eng.peers[balance.Coordinator] == nil {
		reply(&StepDone{Header: h, Error: "stage is not connected"})
		return
	}
	busy := make(chan struct{})
	a.busy = busy
	go func() {
		d := f()
		close(busy) // before the reply: the requester may send the next request at once
		reply(d)
	}()
}

func (a *stageActor) closeListeners() {
	for _, ln := range a.lns {
		ln.Close()
	}
	a.lns = nil
}

// closeMigrationListeners stops listening for state from a previous plan.
func (a *stageActor) closeMigrationListeners() {
	for _, ln := range a.migLns {
		ln.Close()
	}
	a.migLns = nil
}

// shutdown aborts a running step (its links close under it), waits for it
// and frees everything. It is idempotent.
func (a *stageActor) shutdown() {
	a.stopped = true
	a.closeListeners()
	a.closeMigrationListeners()
	if a.eng == nil {
		return
	}
	close(a.quit)
	for _, p := range a.eng.peers {
		p.lk.Close()
	}
	a.eng.abort(dataplane.ErrClosed)
	if a.busy != nil {
		<-a.busy
	}
	a.eng.close()
	if a.eng.turn != nil {
		a.host.releaseTurn(a.eng.turn)
	}
	a.eng = nil
	a.host.stageDown(a)
}
