package actors

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/nn"
	"google.golang.org/protobuf/proto"
)

// Moving a job to a new plan without a cut, one way the core's plan change
// loads the new stages' state (the coordinator's side is
// Coordinator.move, operations.go). At a step boundary
// the pipeline is drained and every stage holds the state after the same
// step. The coordinator starts the new plan's stages next to the old ones,
// each with the list of its layers' old owners (StageSpec.Sources), and
// then asks every old stage to send (SendState) and every new stage to
// receive (ReceiveState) at once:
//
//	old stage k (node A) ──data-plane link──► new stage j (node B)   A ≠ B
//	old stage k (node A) ──StageHost handoff──► new stage j (node A)
//
// Between nodes the state of a layer travels once, straight from its old
// owner to its new one, over a link of the new plan's generation that the
// new stage listens for; within a node it is copied in process and never
// touches the network. The coordinator carries only control messages. A
// receiver closes the link when it has read everything: that end of the
// stream is the sender's receipt. Old stages stay alive until every new
// stage has confirmed, then the coordinator stops them; any failure
// (a dead node, a broken link, the deadline) makes the coordinator recover
// from its latest cut instead.

// migrateLinkID names the link that moves state from stage from of the
// previous plan to stage to of the new one; it never equals a linkID.
func migrateLinkID(from, to int) uint32 { return 1<<31 | uint32(from)<<16 | uint32(to) }

// maxStages bounds stage indices in a move (they share a link id).
const maxStages = 1 << 15

// checkSources validates a stage's sources against its plan: known layers
// of the stage, each from one source, one source per old stage.
func checkSources(p balance.StagePlan, srcs []core.StateSource) error {
	layers := map[string]bool{}
	from := map[int]bool{}
	for _, s := range srcs {
		if s.From < 0 || s.From >= maxStages || p.ID < 0 || p.ID >= maxStages {
			return fmt.Errorf("stage %d: state source stage %d out of range", p.ID, s.From)
		}
		if from[s.From] {
			return fmt.Errorf("stage %d: stage %d is given twice as a state source", p.ID, s.From)
		}
		from[s.From] = true
		if len(s.Layers) == 0 {
			return fmt.Errorf("stage %d: state source stage %d lists no layers", p.ID, s.From)
		}
		for _, l := range s.Layers {
			if !slices.Contains(p.Layers, l) {
				return fmt.Errorf("stage %d: state source stage %d lists layer %q, which is not on this stage", p.ID, s.From, l)
			}
			if layers[l] {
				return fmt.Errorf("stage %d: layer %q has two state sources", p.ID, l)
			}
			layers[l] = true
		}
	}
	return nil
}

// layerState lists the state of the stage's layers as a move sends it:
// per layer in the order given, per parameter or buffer its value, then
// (trainable) its optimizer tensors by name. Not safe for concurrent use
// with the optimizer.
func (e *stageEngine) layerState(layers []string) ([]*nn.Tensor, error) {
	var ts []*nn.Tensor
	for _, l := range layers {
		if !slices.Contains(e.spec.Plan.Layers, l) {
			return nil, fmt.Errorf("stage %d has no layer %q", e.spec.Plan.ID, l)
		}
		ts = append(ts, stateTensors(e.g.Node(l).Layer.Params(), e.opt, true)...)
	}
	return ts, nil
}

// dataBytes is the size of a tensor's data; wireBytes what a link writes
// for it in the raw codec (the codec of every move): tag, frame header,
// data.
func dataBytes(t *nn.Tensor) int64 { return 4 * int64(t.Shape().TotalSize()) }

func wireBytes(t *nn.Tensor) int64 { return dataplane.RawWireBytes(t.Shape()) }

// moveTimeout is a move's deadline from its message (default 2 min).
func moveTimeout(ms int64) time.Time {
	d := time.Duration(ms) * time.Millisecond
	if d <= 0 {
		d = 2 * time.Minute
	}
	return time.Now().Add(d)
}

// moveSkew bounds how far apart the two ends of a move put its deadline
// (each from the message's timeout as it arrives).
const moveSkew = time.Second

// closeOnAbort closes c when quit is closed or the deadline passes, until
// the returned function is called; abortErr then explains an error of an
// operation on c.
func closeOnAbort(c io.Closer, quit <-chan struct{}, deadline time.Time) (stop func(), abortErr func(error) error) {
	done := make(chan struct{})
	var why error
	var mu sync.Mutex // guards why
	t := time.NewTimer(time.Until(deadline))
	go func() {
		defer t.Stop()
		var reason error
		select {
		case <-done:
			return
		case <-quit:
			reason = errors.New("the stage stopped")
		case <-t.C:
			reason = errors.New("the move timed out")
		}
		mu.Lock()
		why = reason
		mu.Unlock()
		c.Close()
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done) }) }
	abortErr = func(err error) error {
		mu.Lock()
		defer mu.Unlock()
		if why == nil && time.Until(deadline) < moveSkew {
			// The other end's deadline passed first and it closed the link.
			why = errors.New("the move timed out")
		}
		if why != nil {
			return fmt.Errorf("%w (%w)", why, err)
		}
		return err
	}
	return stop, abortErr
}

// ---- In-process handoff between two stages of one node ----

// handoffKey names one transfer within a node.
type handoffKey struct {
	job      string
	gen      uint64 // the new plan's
	from, to int
}

// handoff is the meeting point of the two stages of a transfer: the giver
// sets ts and closes ready, the taker copies ts and sends the outcome on
// done.
type handoff struct {
	given bool
	ready chan struct{}
	ts    []*nn.Tensor
	done  chan error
}

func (h *StageHost) handoff(k handoffKey) *handoff {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.handoffs == nil {
		h.handoffs = map[handoffKey]*handoff{}
	}
	hf := h.handoffs[k]
	if hf == nil {
		hf = &handoff{ready: make(chan struct{}), done: make(chan error, 1)}
		h.handoffs[k] = hf
	}
	return hf
}

func (h *StageHost) dropHandoff(k handoffKey, hf *handoff) {
	h.mu.Lock()
	if h.handoffs[k] == hf {
		delete(h.handoffs, k)
	}
	h.mu.Unlock()
}

// give hands ts (the giving stage's own tensors, left untouched until it
// returns) to the stage that takes k, and waits until they are copied.
func (h *StageHost) give(k handoffKey, ts []*nn.Tensor, quit <-chan struct{}, deadline time.Time) error {
	hf := h.handoff(k)
	h.mu.Lock()
	given := hf.given
	hf.given = true
	h.mu.Unlock()
	if given {
		return fmt.Errorf("the state of stage %d for stage %d is handed over twice", k.from, k.to)
	}
	hf.ts = ts
	close(hf.ready)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-hf.done:
		return err
	case <-quit:
		h.dropHandoff(k, hf)
		return errors.New("the stage stopped while handing its state over")
	case <-t.C:
		h.dropHandoff(k, hf)
		return fmt.Errorf("stage %d did not take the state handed over within the node in time", k.to)
	}
}

// take waits for the state given under k and copies it into ts.
func (h *StageHost) take(k handoffKey, ts []*nn.Tensor, quit <-chan struct{}, deadline time.Time) (int64, error) {
	hf := h.handoff(k)
	defer h.dropHandoff(k, hf)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-hf.ready:
	case <-quit:
		return 0, errors.New("the stage stopped while taking its state over")
	case <-t.C:
		return 0, fmt.Errorf("stage %d did not hand its state over within the node in time", k.from)
	}
	var n int64
	err := func() error {
		if len(hf.ts) != len(ts) {
			return fmt.Errorf("stage %d hands over %d state tensors, want %d", k.from, len(hf.ts), len(ts))
		}
		for i, src := range hf.ts {
			if !nn.SameShape(src.Shape(), ts[i].Shape()) {
				return fmt.Errorf("state tensor %d from stage %d has shape %v, want %v", i, k.from, src.Shape(), ts[i].Shape())
			}
			copy(nn.F32(ts[i]), nn.F32(src))
			n += dataBytes(src)
		}
		return nil
	}()
	hf.done <- err
	return n, err
}

// ---- The stage actor's side ----

func stateMoved(h *Header, stats []*TransferStats, err error) proto.Message {
	m := &StateMoved{Header: h, Transfers: stats}
	if err != nil {
		m.Error = err.Error()
	}
	return m
}

// sendState sends the state of the stage's layers to the new plan's stages
// as msg lists them.
func (a *stageActor) sendState(msg *SendState, quit <-chan struct{}) ([]*TransferStats, error) {
	e := a.eng
	me := e.spec.Plan.ID
	deadline := moveTimeout(msg.GetTimeoutMs())
	trs := msg.GetTransfers()
	lists := make([][]*nn.Tensor, len(trs))
	seen := map[string]bool{}
	for i, tr := range trs {
		if int(tr.GetFrom()) != me || tr.GetTo() < 0 || tr.GetTo() >= maxStages {
			return nil, fmt.Errorf("stage %d asked to send the state of stage %d to stage %d", me, tr.GetFrom(), tr.GetTo())
		}
		for _, l := range tr.GetLayers() {
			if seen[l] {
				return nil, fmt.Errorf("stage %d asked to send layer %q twice", me, l)
			}
			seen[l] = true
		}
		var err error
		if lists[i], err = e.layerState(tr.GetLayers()); err != nil {
			return nil, err
		}
	}
	stats := make([]*TransferStats, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for i, tr := range trs {
		st := &TransferStats{From: tr.GetFrom(), To: tr.GetTo(), Local: tr.GetAddr() == "", Tensors: int64(len(lists[i]))}
		stats[i] = st
		wg.Go(func() {
			if st.Local {
				k := handoffKey{e.spec.Job.ID(), msg.GetHeader().GetGeneration(), me, int(st.To)}
				if errs[i] = a.host.give(k, lists[i], quit, deadline); errs[i] == nil {
					for _, t := range lists[i] {
						st.Bytes += dataBytes(t)
					}
				}
			} else {
				errs[i] = a.sendRemote(tr, msg.GetHeader().GetGeneration(), lists[i], st, quit, deadline)
			}
			if errs[i] != nil {
				errs[i] = fmt.Errorf("state for stage %d: %w", st.To, errs[i])
			}
		})
	}
	wg.Wait()
	return stats, errors.Join(errs...)
}

// sendRemote sends ts over a new link to the receiver's address and waits
// for its receipt (it closes the link once it has read everything).
func (a *stageActor) sendRemote(tr *StateTransfer, gen uint64, ts []*nn.Tensor, st *TransferStats, quit <-chan struct{}, deadline time.Time) error {
	spec := a.eng.spec
	from, to := int(tr.GetFrom()), int(tr.GetTo())
	h := dataplane.Hello{JobID: spec.Job.ID(), Generation: gen, Link: migrateLinkID(from, to), From: stageWire(from), To: stageWire(to)}
	lk, err := a.host.DataPlane.Dial(tr.GetAddr(), h, a.moveOptions(spec))
	if err != nil {
		return err
	}
	defer lk.Close()
	stop, abortErr := closeOnAbort(lk, quit, deadline)
	defer stop()
	for i, t := range ts {
		if err := lk.Send(dataplane.Tag{Kind: dataplane.KindWeights, Tensor: uint32(i)}, t); err != nil {
			return abortErr(err)
		}
		st.Bytes += dataBytes(t)
		st.WireBytes += wireBytes(t)
	}
	switch tag, _, err := lk.Recv(nil); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return abortErr(fmt.Errorf("waiting for the receipt: %w", err))
	default:
		return fmt.Errorf("waiting for the receipt: got a tensor (%v %d)", tag.Kind, tag.Tensor)
	}
}

// receiveState takes the state of the stage's layers from its sources and
// continues after msg's steps.
func (a *stageActor) receiveState(msg *ReceiveState, accepts <-chan acceptResult, quit <-chan struct{}) ([]*TransferStats, error) {
	e := a.eng
	me := e.spec.Plan.ID
	if msg.GetSteps() < 0 {
		return nil, fmt.Errorf("stage %d: asked to continue after %d steps", me, msg.GetSteps())
	}
	deadline := moveTimeout(msg.GetTimeoutMs())
	srcs := e.spec.Sources
	covered := map[string]bool{}
	lists := make([][]*nn.Tensor, len(srcs))
	remote := map[int]int{} // old stage -> index in srcs
	for i, s := range srcs {
		for _, l := range s.Layers {
			covered[l] = true
		}
		var err error
		if lists[i], err = e.layerState(s.Layers); err != nil {
			return nil, err
		}
		if !s.Local {
			remote[s.From] = i
		}
	}
	for _, l := range e.spec.Plan.Layers {
		if !covered[l] && len(e.g.Node(l).Layer.Params()) > 0 {
			return nil, fmt.Errorf("stage %d: no source for the state of layer %q", me, l)
		}
	}
	if len(remote) > 0 && accepts == nil {
		return nil, fmt.Errorf("stage %d: its state was received already", me)
	}
	stats := make([]*TransferStats, len(srcs))
	errs := make([]error, len(srcs))
	var wg sync.WaitGroup
	for i, s := range srcs {
		stats[i] = &TransferStats{From: int32(s.From), To: int32(me), Local: s.Local, Tensors: int64(len(lists[i]))}
		if s.Local {
			wg.Go(func() {
				k := handoffKey{e.spec.Job.ID(), e.spec.Generation, s.From, me}
				stats[i].Bytes, errs[i] = a.host.take(k, lists[i], quit, deadline)
			})
		}
	}
	var acceptErr error
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for range remote {
		var r acceptResult
		select {
		case r = <-accepts:
		case <-quit:
			acceptErr = errors.New("the stage stopped")
		case <-t.C:
			acceptErr = errors.New("the move timed out")
		}
		if acceptErr != nil {
			acceptErr = fmt.Errorf("stage %d: waiting for the links that bring its state: %w", me, acceptErr)
			break
		}
		i, ok := remote[r.from]
		if r.err != nil || !ok {
			acceptErr = fmt.Errorf("stage %d: the link from stage %d with its state: %v", me, r.from, r.err)
			if r.lk != nil {
				r.lk.Close()
			}
			break
		}
		wg.Go(func() { errs[i] = recvState(r.lk, lists[i], stats[i], quit, deadline) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("stage %d: state from stage %d: %w", me, srcs[i].From, err)
		}
	}
	if err := errors.Join(append(errs, acceptErr)...); err != nil {
		return stats, err
	}
	e.opt.SetSteps(int(msg.GetSteps()))
	return stats, nil
}

// recvState reads ts, in order, from lk and closes it: the sender's
// receipt.
func recvState(lk dataplane.Link, ts []*nn.Tensor, st *TransferStats, quit <-chan struct{}, deadline time.Time) error {
	defer lk.Close()
	stop, abortErr := closeOnAbort(lk, quit, deadline)
	defer stop()
	for i, t := range ts {
		shape := slices.Clone(t.Shape())
		tag, got, err := lk.Recv(t)
		if err != nil {
			return abortErr(err)
		}
		if tag.Kind != dataplane.KindWeights || tag.Tensor != uint32(i) || got != t || !nn.SameShape(got.Shape(), shape) {
			return fmt.Errorf("got %v %d of shape %v, want state tensor %d of shape %v", tag.Kind, tag.Tensor, got.Shape(), i, shape)
		}
		st.Bytes += dataBytes(t)
	}
	return nil
}
