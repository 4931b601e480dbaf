package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/nn"
	"google.golang.org/protobuf/proto"
)

// The coordinator's operations: each runs on a goroutine of its own while
// the coordinator's loop waits for its outcome (see Coordinator.start).

// probe returns the nodes that answer a ping; the endpoints of the others
// are dropped (remote would keep redialling them).
func (c *Coordinator) probe(ctx context.Context, nodes []job.NodeInfo) []job.NodeInfo {
	live := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { live[i] = c.cfg.Control.Ping(ctx, n.ActorAddr, time.Second) == nil })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil // the pings were cut short: they say nothing of the nodes
	}
	var out []job.NodeInfo
	for i, n := range nodes {
		if live[i] {
			out = append(out, n)
		} else {
			c.cfg.Control.Forget(n.ActorAddr)
		}
	}
	return out
}

// measureLinks measures the links of pairs between live nodes (or takes
// measurements at most maxAge old), one at a time (two probes at once
// could share a network interface); a link that cannot be measured is
// logged and left out. After a failure the round skips the other links of
// its two nodes: one of them is in trouble (a cut link, a machine gone),
// and each probe of it would wait out its timeout while the job, maybe
// failing over, waits for the round.
func measureLinks(ctx context.Context, prober LinkProber, log *slog.Logger, live []job.NodeInfo, pairs [][2]string, maxAge time.Duration) []core.LinkMeasure {
	if prober == nil {
		return nil
	}
	byName := map[string]job.NodeInfo{}
	for _, n := range live {
		byName[n.Name] = n
	}
	troubled := map[string]bool{}
	var out []core.LinkMeasure
	for _, p := range pairs {
		from, ok1 := byName[p[0]]
		to, ok2 := byName[p[1]]
		if !ok1 || !ok2 || ctx.Err() != nil || troubled[p[0]] || troubled[p[1]] {
			continue
		}
		m, err := prober.MeasureLink(ctx, from, to, maxAge)
		if err != nil {
			log.Warn("measuring a link", "from", p[0], "to", p[1], "err", err)
			troubled[p[0]], troubled[p[1]] = true, true
			continue
		}
		out = append(out, m)
	}
	return out
}

// startStages spawns, sets up and connects the stages of plan under
// generation gen; sources, if set, are where each stage's layers' state
// will come from (a direct move). The stages are registered (c.sets) when
// the outcome reaches the coordinator's loop; a failure, or the end of
// ctx, stops those already spawned.
func (c *Coordinator) startStages(ctx context.Context, a core.StartStages) (s *stageSet, params []int64, err error) {
	gen, plan := a.Gen, a.Plan
	S := len(plan.Stages)
	s = &stageSet{gen: gen, plan: plan, refs: make([]StageRef, S), links: map[int]dataplane.Link{}, sent: map[int]dataplane.Stats{}, migrate: make([][]*LinkAddr, S)}
	s.feeds, s.loss = feedTargets(plan)
	if ts := plan.TiedAcross(c.job.Graph); len(ts) > 0 {
		var on []string
		for _, t := range ts {
			on = append(on, t.String())
		}
		c.log.Info("tied weights: the copies' gradients are summed across stages before each step", "generation", gen, "tensors", strings.Join(on, "; "))
	}
	for _, sp := range plan.Stages {
		st, err := c.job.Graph.Stage(sp.Layers)
		if err != nil {
			return nil, nil, err
		}
		s.views = append(s.views, st)
	}
	defer func() {
		if err != nil {
			c.stopStages(s, false)
			s = nil
		}
	}()
	if len(a.Addrs) != S {
		return s, nil, fmt.Errorf("%d addresses for %d stages", len(a.Addrs), S)
	}
	h := &Header{JobId: c.spec.ID, Generation: gen}
	params = make([]int64, S)
	listen := make([][]*LinkAddr, S)
	groups := groupsOf(plan)
	// The stages that share a node (an interleaved plan's chunks) take
	// turns in its order.
	turns := map[string][]balance.Slot{}
	if plan.Schedule == balance.Interleaved {
		for _, sp := range plan.Stages {
			if _, ok := turns[sp.Node]; !ok {
				if turns[sp.Node], err = plan.NodeOrder(sp.Node); err != nil {
					return s, nil, err
				}
			}
		}
	}
	var mu sync.Mutex // guards s.refs while the stages are spawned
	err = forEachStage(S, func(k int) error {
		sp := plan.Stages[k]
		ref, err := c.spawn(ctx, a.Addrs[k], &SpawnStage{Header: h, Kind: StageKind, Stage: int32(k)})
		if err != nil {
			return fmt.Errorf("stage %d on %s: %w", k, sp.Node, err)
		}
		mu.Lock()
		s.refs[k] = ref
		mu.Unlock()
		spec := StageSpec{Job: c.checked, Generation: gen, Data: job.SampleOf(c.job.Set),
			Graph: plan.Graph, Plan: sp, Rates: stageRates(a.Rates, k), Groups: groups, Turn: turns[sp.Node]}
		if a.Sources != nil {
			spec.Sources = a.Sources[k]
		}
		b, err := marshalStageSpec(spec)
		if err != nil {
			return err
		}
		r, err := c.requestCtx(ctx, ref, &SetupStage{Header: h, Spec: b})
		if err != nil {
			return fmt.Errorf("setting up stage %d on %s: %w", k, sp.Node, err)
		}
		rep, ok := r.(*SetupStageReply)
		if !ok {
			return fmt.Errorf("stage %d: unexpected reply %s", k, proto.MessageName(r))
		}
		if rep.GetError() != "" {
			return fmt.Errorf("stage %d on %s: %s", k, sp.Node, rep.GetError())
		}
		listen[k], s.migrate[k], params[k] = rep.GetListen(), rep.GetMigrate(), rep.GetParams()
		return nil
	})
	if err != nil {
		return s, nil, err
	}
	// The coordinator dials its link to every stage first; then every
	// stage dials its downstream links and waits for its incoming ones.
	dials := make([][]*LinkAddr, S)
	for k := range S {
		for _, la := range listen[k] {
			from := int(la.GetFrom())
			if from == balance.Coordinator {
				hello := dataplane.Hello{JobID: c.spec.ID, Generation: gen, Link: linkID(from, k), From: stageWire(from), To: stageWire(k)}
				o := dataplane.Options{IOTimeout: c.stepTimeout(), HandshakeTimeout: c.cfg.HandshakeTimeout, Auto: c.spec.AutoCodecs(), Rate: a.Rates[[2]int{from, k}]}
				lk, err := c.cfg.DataPlane.Dial(la.GetAddr(), hello, o)
				if err != nil {
					return s, nil, fmt.Errorf("coordinator link to stage %d: %w", k, err)
				}
				s.links[k] = lk
				continue
			}
			if from < 0 || from >= S {
				return s, nil, fmt.Errorf("stage %d listens for a link from unknown stage %d", k, from)
			}
			dials[from] = append(dials[from], la)
		}
		if s.links[k] == nil {
			return s, nil, fmt.Errorf("stage %d has no link from the coordinator", k)
		}
	}
	err = forEachStage(S, func(k int) error {
		r, err := c.requestCtx(ctx, s.refs[k], &ConnectStage{Header: h, Dial: dials[k]})
		if err != nil {
			return fmt.Errorf("connecting stage %d: %w", k, err)
		}
		if err := ackErr(k, r); err != nil {
			return fmt.Errorf("connecting %w", err)
		}
		return nil
	})
	return s, params, err
}

// groupsOf lists the group of each executor of a plan with replicas (nil
// without).
func groupsOf(p *balance.Plan) []int {
	if !p.Replicated() {
		return nil
	}
	gs := make([]int, len(p.Stages))
	for k, sp := range p.Stages {
		gs[k] = sp.Group
	}
	return gs
}

// stepTimeout is the longest a step may take: the bound of every read and
// write on the coordinator's links.
func (c *Coordinator) stepTimeout() time.Duration {
	if c.cfg.StepTimeout > 0 {
		return c.cfg.StepTimeout
	}
	return 10 * time.Minute
}

func ackErr(k int, r proto.Message) error {
	a, ok := r.(*Ack)
	if !ok {
		return fmt.Errorf("stage %d: unexpected reply %s", k, proto.MessageName(r))
	}
	if !a.GetOk() {
		return fmt.Errorf("stage %d: %s", k, a.GetError())
	}
	return nil
}

// forEachStage runs f for stages 0..S-1 concurrently and returns the
// errors by stage order.
func forEachStage(S int, f func(k int) error) error {
	errs := make([]error, S)
	var wg sync.WaitGroup
	for k := range S {
		wg.Go(func() { errs[k] = f(k) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// spawn is Control.Spawn that gives up when ctx ends; a stage spawned
// after that is stopped when its reply comes.
func (c *Coordinator) spawn(ctx context.Context, addr string, req *SpawnStage) (StageRef, error) {
	type spawned struct {
		ref StageRef
		err error
	}
	ch := make(chan spawned, 1)
	go func() {
		ref, err := c.cfg.Control.Spawn(addr, req, c.cfg.Timeout)
		ch <- spawned{ref, err}
	}()
	select {
	case r := <-ch:
		return r.ref, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil {
				c.cfg.Control.Send(r.ref, &StopStage{Header: req.GetHeader()})
			}
		}()
		return StageRef{}, ctx.Err()
	}
}

// requestCtx is a control request that gives up when ctx ends.
func (c *Coordinator) requestCtx(ctx context.Context, ref StageRef, msg proto.Message) (proto.Message, error) {
	select {
	case r := <-c.request(ref, msg, c.cfg.Timeout):
		return r.msg, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// request sends msg to a stage and yields its reply on a channel.
func (c *Coordinator) request(ref StageRef, msg proto.Message, timeout time.Duration) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		r, err := c.cfg.Control.Request(ref, msg, timeout)
		ch <- reply{r, err}
	}()
	return ch
}

type reply struct {
	msg proto.Message
	err error
}

// step runs step a.Step on the stages of s: StepBegin to all, the
// micro-batches and labels over the coordinator's links, then every
// stage's StepDone.
func (c *Coordinator) step(ctx context.Context, s *stageSet, a core.RunStep) core.Event {
	ev := core.StepFinished{Op: a.Op}
	if s == nil {
		ev.Err = errors.New("no stages")
		return ev
	}
	j := c.job
	M := c.spec.MicroBatches
	epoch, step := a.Step/j.StepsPerEpoch, a.Step%j.StepsPerEpoch
	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	var mass float64 // the mini-batch's, for the loss stages' mean (nn.Trainer's sum)
	for m := range M {
		j.Loader.Fill(epoch, step, m, &c.batches[m])
		mass += j.Mass(c.batches[m].Y)
	}
	dones := make([]<-chan reply, len(s.refs))
	for k, ref := range s.refs {
		begin := &StepBegin{Header: h, Step: uint64(a.Step), MicroBatches: uint32(M), Lr: a.LR, LinkRates: map[int32]float64{}, Mass: mass}
		for p, r := range a.Rates {
			if p[0] == k {
				begin.LinkRates[int32(p[1])] = r
			}
		}
		dones[k] = c.request(ref, begin, a.Timeout)
	}
	for k, lk := range s.links {
		if r, ok := a.Rates[[2]int{balance.Coordinator, k}]; ok {
			lk.SetRate(r)
		}
	}
	for m := range M {
		b := &c.batches[m]
		c.labels[m] = labelTensor(b.Y, c.labels[m])
		for _, f := range s.feeds {
			if !f.micros[m] {
				continue
			}
			for _, name := range f.inputs {
				i := slices.Index(j.Graph.InputNames, name)
				id, ok := tensorID(j.Graph, name)
				if i < 0 || !ok {
					ev.Err = fmt.Errorf("stage %d reads %q, which is no input of the model", f.stage, name)
					return ev
				}
				if err := s.links[f.stage].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: uint32(m), Tensor: id}, b.X[i]); err != nil {
					ev.Err = fmt.Errorf("feeding stage %d: %w", f.stage, err)
					return ev
				}
			}
		}
		if err := s.links[s.loss[m]].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: uint32(m), Tensor: labelsTensor}, c.labels[m]); err != nil {
			ev.Err = fmt.Errorf("labels to stage %d: %w", s.loss[m], err)
			return ev
		}
	}
	for k, lk := range s.links {
		st := lk.Stats()
		ev.Feeds = append(ev.Feeds, jobSent(sentOf(k, st.Sub(s.sent[k])))...)
		s.sent[k] = st
	}
	ev.Timings = make([]core.StageTiming, len(s.refs))
	losses := make([]*StepDone, len(s.refs)) // summed in stage order: replicas of the loss stage each have some
	var sumsq map[string]float64             // with clipping: each parameter's, from whichever stage has it
	if c.clipOrder != nil {
		sumsq = make(map[string]float64, len(c.clipOrder))
	}
	ev.Err = waitAll(ctx, dones, func(k int, r proto.Message) error {
		d, ok := r.(*StepDone)
		if !ok {
			return fmt.Errorf("stage %d: unexpected reply %T", k, r)
		}
		if d.GetError() != "" {
			return fmt.Errorf("stage %d: %s", k, d.GetError())
		}
		if len(d.GetTimings()) > 0 {
			t := d.GetTimings()[0]
			ev.Timings[k] = core.StageTiming{Forward: time.Duration(t.GetForwardNs()), Backward: time.Duration(t.GetBackwardNs()),
				Update: time.Duration(t.GetUpdateNs()), Wait: time.Duration(t.GetWaitNs()), Wall: time.Duration(t.GetWallNs()),
				CapacityGFLOPS: t.GetCapacityGflops(), CPU: time.Duration(t.GetCpuNs()), CPUs: t.GetCpus(), Links: jobSent(t.GetLinks()), Passes: passesOf(t.GetPasses())}
		}
		if d.GetHasLoss() {
			losses[k] = d
		}
		if len(d.GetGradNames()) != len(d.GetGradSumsq()) {
			return fmt.Errorf("stage %d: %d gradient sums for %d names", k, len(d.GetGradSumsq()), len(d.GetGradNames()))
		}
		for i, n := range d.GetGradNames() {
			sumsq[n] = d.GetGradSumsq()[i]
		}
		return nil
	})
	if ev.Err == nil && sumsq != nil {
		ev.Err = c.clip(ctx, s, a.Step, sumsq)
	}
	var loss float64
	for _, d := range losses {
		if d != nil {
			loss += d.GetLoss()
			ev.Correct += d.GetCorrect()
			ev.Seen += d.GetSamples()
		}
	}
	if mass > 0 {
		ev.Loss = loss / mass
	}
	return ev
}

// clip gives the stages of s the scale of step's gradients under
// clipping: the norm over the model's trainable parameters, each once, in
// the model's order, as nn.ClipGrads takes it in one process.
func (c *Coordinator) clip(ctx context.Context, s *stageSet, step int, sumsq map[string]float64) error {
	ordered := make([]float64, len(c.clipOrder))
	for i, name := range c.clipOrder {
		v, ok := sumsq[name]
		if !ok {
			return fmt.Errorf("clipping: no stage sent the gradient of %s", name)
		}
		ordered[i] = v
	}
	scale := nn.ClipScale(ordered, c.spec.ClipGradNorm)
	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	replies := make([]<-chan reply, len(s.refs))
	for k, ref := range s.refs {
		replies[k] = c.request(ref, &ClipGrads{Header: h, Step: uint64(step), Scale: scale}, c.cfg.Timeout)
	}
	return waitAll(ctx, replies, ackErr)
}

// stageRates are the rates of stage k's links by peer.
func stageRates(rates map[[2]int]float64, k int) map[int]float64 {
	out := map[int]float64{}
	for p, r := range rates {
		if p[0] == k {
			out[p[1]] = r
		}
	}
	return out
}

// sentOf describes what a link to peer sent, by kind (kinds it did not
// send are left out).
func sentOf(peer int, d dataplane.Stats) []*LinkSent {
	var out []*LinkSent
	for k, ks := range d {
		if ks.Frames == 0 {
			continue
		}
		out = append(out, &LinkSent{Peer: int32(peer), Kind: uint32(k), Codec: ks.Codec.String(), Frames: ks.Frames,
			RawBytes: ks.RawBytes, WireBytes: ks.WireBytes, EncodeNs: ks.EncodeNs, WriteNs: ks.WriteNs, SampleNs: ks.SampleNs})
	}
	return out
}

func jobSent(ls []*LinkSent) []core.LinkSent {
	out := make([]core.LinkSent, 0, len(ls))
	for _, l := range ls {
		out = append(out, core.LinkSent{Peer: int(l.GetPeer()), Kind: dataplane.Kind(l.GetKind()).String(), Codec: l.GetCodec(),
			Frames: l.GetFrames(), RawBytes: l.GetRawBytes(), WireBytes: l.GetWireBytes(),
			Encode: time.Duration(l.GetEncodeNs()), Write: time.Duration(l.GetWriteNs()), Sample: time.Duration(l.GetSampleNs())})
	}
	return out
}

// waitAll waits for the replies and checks each with check (called on this
// goroutine, in arrival order). It returns at the first failure, without
// waiting for the others: the caller abandons the stages, which ends the
// requests still running.
func waitAll(ctx context.Context, replies []<-chan reply, check func(k int, r proto.Message) error) error {
	type result struct {
		k int
		reply
	}
	ch := make(chan result, len(replies))
	for k, r := range replies {
		go func() { ch <- result{k, <-r} }()
	}
	for range replies {
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil {
			return fmt.Errorf("stage %d: %w", r.k, r.err)
		}
		if err := check(r.k, r.msg); err != nil {
			return err
		}
	}
	return nil
}

// evalNewsEvery bounds how often an evaluation tells the core how far it
// has got.
const evalNewsEvery = 250 * time.Millisecond

// takeCut gathers the state of the stages of s after a.Step into the
// coordinator's model, as the latest cut (the pipeline is drained between
// steps, so the cut is consistent); with a store it is then written and
// copied in the background (CutPersisted). With a.Evaluate the stages
// measure the test accuracy of the weights too (evaluate).
func (c *Coordinator) takeCut(ctx context.Context, s *stageSet, a core.TakeCut) core.Event {
	ev := core.CutTaken{Op: a.Op}
	t0 := c.clk.Now()
	c.persisting.Wait() // the model's tensors are the previous cut's until written
	if err := c.gather(s); err != nil {
		ev.Err = err
		return ev
	}
	c.meter.cut(c.clk.Now().Sub(t0))
	if a.Evaluate {
		var said time.Time
		progress := func(done, samples int) {
			if now := c.clk.Now(); done == samples || now.Sub(said) >= evalNewsEvery {
				said = now
				c.post(core.Evaluating{Step: a.Step, Done: done, Samples: samples})
			}
		}
		t0 := c.clk.Now()
		var err error
		ev.Accuracy, ev.TestLoss, ev.AUC, err = c.evaluate(ctx, s, a.Step, progress)
		if ev.OnStages = err == nil; err != nil {
			if ctx.Err() != nil {
				ev.Err = err
				return ev
			}
			// The cut is whole: the coordinator evaluates its weights.
			c.log.Warn("the stages' evaluation failed; evaluating on the coordinator", "step", a.Step, "err", err)
			be, err := c.spec.NewBackend(c.cfg.Threads)
			if err != nil {
				ev.Err = err
				return ev
			}
			opt, _ := c.spec.NewOptimizer(1)
			ev.Accuracy, ev.TestLoss, ev.AUC = c.job.Evaluate(c.job.NewTrainer(opt, be), progress)
		}
		ev.Evaluated = c.clk.Now().Sub(t0)
		ev.WeightsSHA256 = nn.WeightsSHA256(c.job.Graph.Params())
	}
	if c.cfg.Store == nil {
		return ev
	}
	ck := c.checkpointFile(s, a.Step, a.Progress)
	c.persisting.Go(func() {
		t0 := c.clk.Now()
		err := func() error {
			if _, err := c.cfg.Store.Save(ck); err != nil {
				return fmt.Errorf("writing: %w", err)
			}
			if c.cfg.Replicas != nil {
				if err := c.cfg.Replicas.Replicate(ck); err != nil {
					return fmt.Errorf("replicating: %w", err)
				}
			}
			return nil
		}()
		c.meter.persist(c.clk.Now().Sub(t0))
		c.log.Debug("cut persisted", "step", a.Step, "ms", job.Millis(c.clk.Now().Sub(t0)), "err", err)
		c.post(core.CutPersisted{Step: a.Step, Err: err})
	})
	return ev
}

// gather reads the state of every stage of s, optimizer included, into the
// coordinator's model and c.copt. The tensors arrive in twins and are
// copied in only once every stage has sent its own: a stage that fails
// halfway must not leave the held cut part old, part new.
func (c *Coordinator) gather(s *stageSet) error {
	if s == nil {
		return errors.New("no stages")
	}
	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	var state [][]*nn.Tensor
	// Replicas of a stage hold the same state: the first of each sends it.
	err := c.moveState(s, "gathering", &GatherWeights{Header: h, Optimizer: true}, func(k int) bool { return s.plan.Stages[k].Replica == 0 }, func(st [][]*nn.Tensor) {
		state = st
		c.keepTwins(st)
	}, func(lk dataplane.Link, i int, t *nn.Tensor) error {
		u := c.twins[t]
		tag, got, err := lk.Recv(u)
		if err != nil {
			return err
		}
		if tag.Kind != dataplane.KindWeights || tag.Tensor != uint32(i) || got != u || !nn.SameShape(got.Shape(), t.Shape()) {
			return fmt.Errorf("got %v %d of shape %v, want state tensor %d of shape %v", tag.Kind, tag.Tensor, got.Shape(), i, t.Shape())
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, ts := range state {
		for _, t := range ts {
			copy(nn.F32(t), nn.F32(c.twins[t]))
		}
	}
	return nil
}

// keepTwins makes c.twins hold a receiving buffer for each state tensor
// of st, and nothing else: buffers of tensors still held are kept from
// the last gather, those of a former plan's tensors dropped.
func (c *Coordinator) keepTwins(st [][]*nn.Tensor) {
	next := map[*nn.Tensor]*nn.Tensor{}
	for _, ts := range st {
		for _, t := range ts {
			u := c.twins[t]
			if u == nil || !nn.SameShape(u.Shape(), t.Shape()) {
				u = nn.New(t.Shape()...)
			}
			next[t] = u
		}
	}
	c.twins = next
}

// restore loads the latest cut, the state after step, into the stages of
// s.
func (c *Coordinator) restore(s *stageSet, step int) error {
	if s == nil {
		return errors.New("no stages")
	}
	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	return c.moveState(s, "restoring", &RestoreStage{Header: h, Steps: int64(step)}, nil, nil, func(lk dataplane.Link, i int, t *nn.Tensor) error {
		return lk.Send(dataplane.Tag{Kind: dataplane.KindWeights, Tensor: uint32(i)}, t)
	})
}

// moveState moves the state tensors of every stage (those for which
// only, if set, is true) over its coordinator link, one call of move per
// tensor, while the stage serves the request msg; a stage that fails or
// refuses closes the transfer (see abortOnFailure). prepare, if set, sees
// all the tensors first, on the caller's goroutine.
func (c *Coordinator) moveState(s *stageSet, what string, msg proto.Message, only func(k int) bool, prepare func([][]*nn.Tensor), move func(lk dataplane.Link, i int, t *nn.Tensor) error) error {
	// Made here, on one goroutine: the optimizer's state map is not safe
	// for concurrent use.
	state := make([][]*nn.Tensor, len(s.views))
	for k, st := range s.views {
		if only == nil || only(k) {
			state[k] = stateTensors(st.Params(), c.copt, true)
		}
	}
	if prepare != nil {
		prepare(state)
	}
	return forEachStage(len(s.refs), func(k int) error {
		if only != nil && !only(k) {
			return nil
		}
		done := abortOnFailure(c.request(s.refs[k], msg, c.cfg.Timeout), s.links[k])
		for i, t := range state[k] {
			if err := move(s.links[k], i, t); err != nil {
				return fmt.Errorf("%s stage %d: %w", what, k, explain(err, done))
			}
		}
		if err := <-done; err != nil {
			return fmt.Errorf("%s stage %d: %w", what, k, err)
		}
		return nil
	})
}

// explain returns the stage's own failure, if it reports one promptly,
// for an error on the link: a refusal explains a closed link better.
func explain(err error, done <-chan error) error {
	t := time.NewTimer(100 * time.Millisecond) // a dead stage does not answer
	defer t.Stop()
	select {
	case r := <-done:
		if r != nil {
			return r
		}
	case <-t.C:
	}
	return err
}

// abortOnFailure waits for a stage's reply to a request whose data moves
// over lk; if the stage fails or refuses, lk is closed so that the other
// end of the transfer does not wait for data that will not come. The
// channel yields the failure, or nil.
func abortOnFailure(replies <-chan reply, lk dataplane.Link) <-chan error {
	ch := make(chan error, 1)
	go func() {
		r := <-replies
		err := r.err
		if err == nil {
			if d, ok := r.msg.(*StepDone); !ok {
				err = fmt.Errorf("unexpected reply %T", r.msg)
			} else if d.GetError() != "" {
				err = errors.New(d.GetError())
			}
		}
		if err != nil {
			lk.Close()
		}
		ch <- err
	}()
	return ch
}

// move hands the state of each layer after a.Step from its stage in the
// old set straight to its stage in the new one (see migrate.go): every new
// stage receives while every old one sends, and the receivers' counts must
// match the senders'.
func (c *Coordinator) move(ctx context.Context, news, olds *stageSet, a core.Move) (*core.Moved, error) {
	if news == nil || olds == nil {
		return nil, errors.New("no stages")
	}
	transfers := map[int][]*StateTransfer{} // per old stage
	for j, srcs := range a.Sources {
		for _, src := range srcs {
			transfers[src.From] = append(transfers[src.From], &StateTransfer{From: int32(src.From), To: int32(j), Layers: src.Layers})
		}
	}
	for j, las := range news.migrate {
		for _, la := range las {
			k := int(la.GetFrom())
			i := -1
			for n, tr := range transfers[k] {
				if int(tr.GetTo()) == j {
					i = n
				}
			}
			if i < 0 || int(la.GetTo()) != j || transfers[k][i].GetAddr() != "" {
				return nil, fmt.Errorf("stage %d listens for state from stage %d, which sends it none", j, k)
			}
			transfers[k][i].Addr = la.GetAddr()
		}
	}
	for k, trs := range transfers {
		for _, tr := range trs {
			if tr.GetAddr() == "" && olds.plan.Stages[k].Node != news.plan.Stages[tr.GetTo()].Node {
				return nil, fmt.Errorf("stage %d does not listen for the state of stage %d", tr.GetTo(), k)
			}
		}
	}
	timeout := c.cfg.Timeout
	ms := (timeout * 9 / 10).Milliseconds() // the stages give up first, and say why
	h := &Header{JobId: c.spec.ID, Generation: news.gen}
	var replies []<-chan reply
	var who []string
	for j, ref := range news.refs {
		replies = append(replies, c.request(ref, &ReceiveState{Header: h, Steps: int64(a.Step), TimeoutMs: ms}, timeout))
		who = append(who, fmt.Sprintf("new stage %d on %s", j, news.plan.Stages[j].Node))
	}
	nNew := len(replies)
	for k, ref := range olds.refs {
		if len(transfers[k]) == 0 {
			continue
		}
		replies = append(replies, c.request(ref, &SendState{Header: h, Transfers: transfers[k], TimeoutMs: ms, Steps: int64(a.Step)}, timeout))
		who = append(who, fmt.Sprintf("old stage %d on %s", k, olds.plan.Stages[k].Node))
	}
	// The links of the stages that take part: a stage of the old plan
	// that sends nothing may be gone (a recovery moves the survivors').
	var links []dataplane.Link
	for _, lk := range news.links {
		links = append(links, lk)
	}
	for k, lk := range olds.links {
		if len(transfers[k]) > 0 {
			links = append(links, lk)
		}
	}
	moved, err := awaitMove(ctx, replies, who, links)
	if err != nil {
		return nil, err
	}
	type pair struct{ from, to int32 }
	got := map[pair]*TransferStats{}
	for _, r := range moved[:nNew] {
		for _, st := range r.GetTransfers() {
			got[pair{st.GetFrom(), st.GetTo()}] = st
		}
	}
	out := &core.Moved{}
	for _, r := range moved[nNew:] {
		for _, st := range r.GetTransfers() {
			rc := got[pair{st.GetFrom(), st.GetTo()}]
			if rc == nil || rc.GetTensors() != st.GetTensors() || rc.GetBytes() != st.GetBytes() || rc.GetLocal() != st.GetLocal() {
				return nil, fmt.Errorf("stage %d sent %d tensors (%d bytes) to stage %d, which reports %v", st.GetFrom(), st.GetTensors(), st.GetBytes(), st.GetTo(), rc)
			}
			delete(got, pair{st.GetFrom(), st.GetTo()})
			from, to := int(st.GetFrom()), int(st.GetTo())
			ml := job.MovedLink{FromStage: from, ToStage: to, From: olds.plan.Stages[from].Node, To: news.plan.Stages[to].Node,
				Local: st.GetLocal(), Tensors: st.GetTensors(), Bytes: st.GetBytes(), WireBytes: st.GetWireBytes()}
			for _, tr := range transfers[from] {
				if int(tr.GetTo()) == to && len(tr.GetLayers()) > 0 {
					ml.Layers = layerRange(tr.GetLayers())
				}
			}
			out.Links = append(out.Links, ml)
			if !ml.Local {
				out.Bytes += ml.Bytes
				out.WireBytes += ml.WireBytes
			}
		}
	}
	if len(got) > 0 {
		return nil, fmt.Errorf("%d transfers were received but not sent", len(got))
	}
	return out, nil
}

func layerRange(ls []string) string {
	if len(ls) == 1 {
		return ls[0]
	}
	return ls[0] + "-" + ls[len(ls)-1]
}

// awaitMove waits for the replies to a move's requests (who names each).
// It fails at the first error, when ctx ends, or when a coordinator link
// to a stage of either plan breaks (its stage or node is gone).
func awaitMove(ctx context.Context, replies []<-chan reply, who []string, links []dataplane.Link) ([]*StateMoved, error) {
	type result struct {
		i int
		reply
	}
	ch := make(chan result, len(replies))
	for i, r := range replies {
		go func() { ch <- result{i, <-r} }()
	}
	stop := make(chan struct{})
	defer close(stop)
	broken := make(chan error, len(links))
	for _, lk := range links {
		go func() {
			select {
			case <-lk.Done():
				broken <- lk.Err()
			case <-stop:
			}
		}()
	}
	out := make([]*StateMoved, len(replies))
	for range replies {
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-broken:
			return nil, fmt.Errorf("moving state: a stage's link to the coordinator broke: %w", err)
		}
		if r.err != nil {
			return nil, fmt.Errorf("moving state: %s: %w", who[r.i], r.err)
		}
		switch m := r.msg.(type) {
		case *StateMoved:
			if m.GetError() != "" {
				return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
			}
			out[r.i] = m
		case *StepDone:
			return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
		case *Ack:
			return nil, fmt.Errorf("moving state: %s: %s", who[r.i], m.GetError())
		default:
			return nil, fmt.Errorf("moving state: %s: unexpected reply %T", who[r.i], r.msg)
		}
	}
	return out, nil
}

// maxPasses bounds the passes kept of one stage's step.
const maxPasses = 4096

// passesOf reads a stage's passes, at most maxPasses, dropping ops that
// are not instructions.
func passesOf(ps []*PassTiming) []core.Pass {
	out := make([]core.Pass, 0, min(len(ps), maxPasses))
	for _, p := range ps[:min(len(ps), maxPasses)] {
		op := balance.Op(p.GetOp())
		if op < balance.OpRecvAct || op > balance.OpWeight {
			continue
		}
		out = append(out, core.Pass{Op: op, Micro: int(p.GetMicro()), Start: time.Duration(p.GetStartNs()), Dur: time.Duration(p.GetDurNs())})
	}
	return out
}
