package actors

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
)

// The pipelined evaluation: the test split's chunks (Job.EvalChunk) flow
// through the stages forward only, as micro-batches do in a step (chunk c
// takes the route of micro-batch c mod M), while the coordinator feeds
// them and sums the loss stages' per-chunk losses in chunk order, so that
// the accuracy and loss are those Job.Evaluate computes in one process.
// Flow control is by credits: a stage that has read a chunk from a peer
// sends it a credit on the gradient path, and a sender keeps at most
// evalWindow chunks in flight to each receiver.

const (
	// evalTag marks an evaluation's data-plane tags: MicroBatch evalTag|c
	// is chunk c, apart from a step's micro-batches.
	evalTag = 1 << 31
	// evalCredit is the tensor id of the credit for a chunk's activations
	// or inputs; the credit for its labels has the labels' id.
	evalCredit = math.MaxUint32 - 1
	// evalWindow is how many chunks a sender may have in flight to one
	// receiver: enough that neither waits for the other in a balanced
	// pipeline, few enough that a receiver holds little. A stage takes at
	// most maxEvalWindow.
	evalWindow    = 3
	maxEvalWindow = 64
)

// evalProgram is the forward part of a stage's program (receive, forward,
// send, loss), grouped by micro-batch in increasing order: every stage
// then handles the chunks in increasing order, which with the credits'
// waits, all on earlier chunks, cannot deadlock.
func evalProgram(prog []balance.Instr) []balance.Instr {
	var out []balance.Instr
	for _, in := range prog {
		switch in.Op {
		case balance.OpRecvAct, balance.OpForward, balance.OpSendAct, balance.OpLoss:
			out = append(out, in)
		}
	}
	slices.SortStableFunc(out, func(a, b balance.Instr) int { return cmp.Compare(a.Micro, b.Micro) })
	return out
}

// evalResult is what a stage's evaluation reports; the loss stage's
// losses are its chunks' summed losses in chunk order.
type evalResult struct {
	losses           []float64
	correct, samples int64
	// forwardNs is the time in forward passes and the loss, waitNs in
	// waits for tensors, credits and sends.
	forwardNs, waitNs, wallNs int64
}

// evaluate runs the stage's part of an evaluation of chunks chunks with
// the weights after step (see EvalBegin).
func (e *stageEngine) evaluate(step, chunks, window int) (res evalResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("stage %d evaluation: %v\n%s", e.spec.Plan.ID, r, debug.Stack())
		}
	}()
	if chunks < 0 || chunks >= evalTag || window < 1 || window > maxEvalWindow {
		return res, fmt.Errorf("evaluation of %d chunks, %d in flight", chunks, window)
	}
	start := time.Now()
	defer func() { res.wallNs = int64(time.Since(start)) }()
	if err := e.settle(math.MaxInt); err != nil {
		return res, err
	}
	ctx := nn.Ctx{Backend: e.be, Seed: e.job.Seed, Step: step}
	// The chunks pass through slot 0 in place of the training buffers,
	// which the next step allocates again: a stage holds one chunk's
	// activations of its layers instead of its micro-batches'.
	for i := range slices.Max(e.slot) + 1 {
		e.st.ReleaseSlot(i)
	}
	clear(e.outs)
	clear(e.gin)
	const slot = 0
	defer e.st.ReleaseSlot(slot)
	loss := e.spec.Job.Spec().NewLoss(e.spec.Data, e.be.Threads())
	// Under the binary cross-entropy the coordinator ranks the outputs
	// (the AUC): a chunk's credit for its labels is its outputs.
	ranks := e.spec.Job.Spec().RanksScores(e.spec.Data)
	credit := nn.New(1)
	ins := make([]*nn.Tensor, len(e.st.Inputs))
	var (
		out   []*nn.Tensor
		from  []int             // the peers the chunk in hand came from
		ahead = map[int][]int{} // per receiver: the chunks sent, not yet credited
	)
	wait := func(k boxKey) (*nn.Tensor, error) {
		t0 := time.Now()
		t, err := e.box.wait(k)
		res.waitNs += int64(time.Since(t0))
		e.box.drop(k)
		return t, err
	}
	flush := func() error {
		t0 := time.Now()
		defer func() { res.waitNs += int64(time.Since(t0)) }()
		for _, pr := range e.peers {
			if err := pr.flush(); err != nil {
				return err
			}
		}
		return nil
	}
	waitCredit := func(q int) error {
		k := boxKey{int32(q), dataplane.KindGradient, uint32(evalTag | ahead[q][0]), evalCredit}
		if _, err := wait(k); err != nil {
			return err
		}
		ahead[q] = ahead[q][1:]
		return nil
	}
	prog := evalProgram(e.spec.Plan.Program)
	for r := 0; r*e.M < chunks; r++ {
		for _, in := range prog {
			c := r*e.M + in.Micro
			if c >= chunks {
				continue
			}
			tag := uint32(evalTag | c)
			switch in.Op {
			case balance.OpRecvAct:
				for _, name := range in.Tensors {
					k := boxKey{int32(in.Peer), actKind(in.Peer), tag, e.id[name]}
					t, err := wait(k)
					if err != nil {
						return res, err
					}
					ins[e.inIdx[name]] = t
				}
				if !slices.Contains(from, in.Peer) {
					from = append(from, in.Peer)
				}
			case balance.OpForward:
				// The slot's outputs of the chunk before may still be queued.
				if err := flush(); err != nil {
					return res, err
				}
				t0 := time.Now()
				out = e.st.Forward(&ctx, slot, ins)
				res.forwardNs += int64(time.Since(t0))
				for _, p := range from {
					if err := e.send(p, dataplane.Tag{Kind: dataplane.KindGradient, MicroBatch: tag, Tensor: evalCredit}, credit); err != nil {
						return res, err
					}
				}
				from = from[:0]
			case balance.OpSendAct:
				if len(ahead[in.Peer]) >= window {
					if err := waitCredit(in.Peer); err != nil {
						return res, err
					}
				}
				for _, name := range in.Tensors {
					if err := e.send(in.Peer, dataplane.Tag{Kind: dataplane.KindActivation, MicroBatch: tag, Tensor: e.id[name]}, out[e.outIdx[name]]); err != nil {
						return res, err
					}
				}
				ahead[in.Peer] = append(ahead[in.Peer], c)
			case balance.OpLoss:
				k := boxKey{int32(balance.Coordinator), dataplane.KindInput, tag, labelsTensor}
				y, err := wait(k)
				if err != nil {
					return res, err
				}
				logits := out[e.outIdx[e.g.Output]]
				labels := nn.F32(y) // its key dropped: no receive writes it again
				if err := loss.Check(logits.Shape(), labels); err != nil {
					return res, fmt.Errorf("chunk %d: %w", c, err)
				}
				t0 := time.Now()
				l, n, _ := loss.Forward(logits, labels, 0)
				res.forwardNs += int64(time.Since(t0))
				res.losses = append(res.losses, l)
				res.correct += int64(n)
				res.samples += int64(loss.Count(labels))
				back := credit
				if ranks {
					back = logits
				}
				if err := e.send(balance.Coordinator, dataplane.Tag{Kind: dataplane.KindGradient, MicroBatch: tag, Tensor: labelsTensor}, back); err != nil {
					return res, err
				}
			}
		}
	}
	// The receivers' last credits: they have read everything sent.
	for _, q := range slices.Sorted(maps.Keys(ahead)) {
		for len(ahead[q]) > 0 {
			if err := waitCredit(q); err != nil {
				return res, err
			}
		}
	}
	return res, flush()
}

// evaluate measures the test accuracy and mean loss of the weights after
// step on the stages of s, the coordinator feeding the chunks. progress,
// if set, hears how many test samples the loss stages have done. A
// failure closes the coordinator's links: the stages stop waiting (and
// stop), and the job's next step fails over.
func (c *Coordinator) evaluate(ctx context.Context, s *stageSet, step int, progress func(done, samples int)) (accuracy, loss, auc float64, err error) {
	if s == nil {
		return 0, 0, 0, errors.New("no stages")
	}
	test := c.job.Set.Test
	size := c.job.EvalChunk()
	chunks := test.EvalChunks(size)
	if chunks == 0 {
		return math.NaN(), math.NaN(), 0, nil
	}
	if chunks >= evalTag {
		return 0, 0, 0, fmt.Errorf("%d chunks of test samples", chunks)
	}
	// Under the binary cross-entropy each chunk's labels come back as its
	// outputs, one a target, into the split's place for them: the AUC
	// (Job.AUC).
	var scores []float32
	L := test.Labels()
	if c.job.RanksScores() {
		scores = make([]float32, len(test.Y))
	}
	M, t0 := c.spec.MicroBatches, c.clk.Now()
	// The credits each link brings back: one a chunk for the inputs its
	// stage reads, one a chunk for the labels.
	expect := map[int]int{}
	for ch := range chunks {
		for _, f := range s.feeds {
			if f.micros[ch%M] {
				expect[f.stage]++
			}
		}
		expect[s.loss[ch%M]]++
	}

	var (
		once    sync.Once
		first   error
		aborted = make(chan struct{})
	)
	abort := func(err error) {
		once.Do(func() {
			first = err
			close(aborted)
			for _, lk := range s.links {
				lk.Close()
			}
		})
	}
	defer context.AfterFunc(ctx, func() { abort(ctx.Err()) })()

	var wg sync.WaitGroup
	credits := map[int]chan struct{}{}
	done := make(chan int, chunks) // per chunk whose loss is computed, its samples
	var readers sync.WaitGroup
	for k, n := range expect {
		credits[k] = make(chan struct{}, n)
		lk := s.links[k]
		readers.Go(func() {
			buf := nn.New(1)
			var outs *nn.Tensor // a chunk's outputs, read into one buffer
			if scores != nil {
				outs = nn.New(size * L)
			}
			pick := func(tag dataplane.Tag) *nn.Tensor {
				if outs != nil && tag.Tensor == labelsTensor {
					return outs
				}
				return buf
			}
			for range n {
				tag, t, err := lk.RecvTo(pick)
				ch := int(tag.MicroBatch &^ evalTag)
				switch {
				case err != nil:
					abort(fmt.Errorf("stage %d: %w", k, err))
					return
				case tag.Kind != dataplane.KindGradient || tag.MicroBatch&evalTag == 0 || ch >= chunks:
					abort(fmt.Errorf("stage %d sent %v frame %d of tensor %d during an evaluation", k, tag.Kind, tag.MicroBatch, tag.Tensor))
					return
				case tag.Tensor == evalCredit:
					credits[k] <- struct{}{}
				case tag.Tensor == labelsTensor:
					rows := min(size, test.N-ch*size)
					if scores != nil {
						if got := len(nn.F32(t)); got != rows*L {
							abort(fmt.Errorf("stage %d sent %d outputs for chunk %d of %d targets", k, got, ch, rows*L))
							return
						}
						copy(scores[ch*size*L:], nn.F32(t))
					}
					done <- rows
				}
			}
		})
	}
	wg.Go(func() {
		readers.Wait()
		close(done)
	})
	wg.Go(func() {
		n := 0
		for d := range done {
			if n += d; progress != nil {
				progress(n, test.N)
			}
		}
	})

	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	timeout := min(c.stepTimeout()*time.Duration(1+chunks/M), 24*time.Hour)
	results := make([]*StepDone, len(s.refs))
	for k, ref := range s.refs {
		r := c.request(ref, &EvalBegin{Header: h, Step: uint64(step), Chunks: uint32(chunks), Window: evalWindow}, timeout)
		wg.Go(func() {
			var rep reply
			select {
			case rep = <-r:
			case <-aborted: // failed already: no stage's reply changes that
				return
			}
			d, ok := rep.msg.(*StepDone)
			switch {
			case rep.err != nil:
				abort(fmt.Errorf("stage %d: %w", k, rep.err))
			case !ok:
				abort(fmt.Errorf("stage %d: unexpected reply %T", k, rep.msg))
			case d.GetError() != "":
				abort(fmt.Errorf("stage %d: %s", k, d.GetError()))
			default:
				results[k] = d
			}
		})
	}

	err = c.feedEval(s, size, chunks, credits, aborted)
	if err != nil {
		abort(err)
	}
	wg.Wait()
	select {
	case <-aborted: // closed after first is set
		return 0, 0, 0, first
	default:
	}
	if c.log.Enabled(ctx, slog.LevelInfo) {
		var per []string
		for k, d := range results {
			for _, t := range d.GetTimings() {
				per = append(per, fmt.Sprintf("%d: forward %.0f, waits %.0f of %.0f ms", k, job.Millis(time.Duration(t.GetForwardNs())),
					job.Millis(time.Duration(t.GetWaitNs())), job.Millis(time.Duration(t.GetWallNs()))))
			}
		}
		c.log.Info("evaluated on the stages", "step", step, "chunks", chunks, "samples", size, "s", c.clk.Now().Sub(t0).Seconds(), "stages", strings.Join(per, "; "))
	}
	if accuracy, loss, err = sumEval(s, results, chunks, M, c.job.Targets(test.Y), c.job.TestMass()); err != nil || scores == nil {
		return accuracy, loss, 0, err
	}
	return accuracy, loss, c.job.AUC(scores), nil
}

// feedEval sends the test split's chunks to the stages that read the
// model's inputs, at most evalWindow ahead of each one's credits, and
// their labels to the loss stage.
func (c *Coordinator) feedEval(s *stageSet, size, chunks int, credits map[int]chan struct{}, aborted <-chan struct{}) error {
	j, M := c.job, c.spec.MicroBatches
	var b nn.Batch
	var y *nn.Tensor
	inFlight := map[int]int{}
	for ch := range chunks {
		m := ch % M
		j.Set.Test.EvalChunk(ch, size, &b)
		tag := uint32(evalTag | ch)
		for _, f := range s.feeds {
			if !f.micros[m] {
				continue
			}
			if inFlight[f.stage] == evalWindow {
				select {
				case <-credits[f.stage]:
					inFlight[f.stage]--
				case <-aborted:
					return nil
				}
			}
			for _, name := range f.inputs {
				i := slices.Index(j.Graph.InputNames, name)
				id, ok := tensorID(j.Graph, name)
				if i < 0 || !ok {
					return fmt.Errorf("stage %d reads %q, which is no input of the model", f.stage, name)
				}
				if err := s.links[f.stage].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: tag, Tensor: id}, b.X[i]); err != nil {
					return fmt.Errorf("feeding stage %d: %w", f.stage, err)
				}
			}
			inFlight[f.stage]++
		}
		y = labelTensor(b.Y, y)
		if err := s.links[s.loss[m]].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: tag, Tensor: labelsTensor}, y); err != nil {
			return fmt.Errorf("labels to stage %d: %w", s.loss[m], err)
		}
	}
	return nil
}

// sumEval adds up the loss stages' results: the chunks' losses in chunk
// order, as Job.Evaluate does, over the test split's labels (one a sample,
// or one a position), the loss divided by their mass (Job.TestMass).
func sumEval(s *stageSet, results []*StepDone, chunks, M, labels int, mass float64) (accuracy, loss float64, err error) {
	next := make([]int, len(results)) // per loss stage: its next chunk's index in ChunkLoss
	var correct, seen int64
	for _, d := range results {
		correct += d.GetCorrect()
		seen += d.GetSamples()
	}
	for ch := range chunks {
		k := s.loss[ch%M]
		ls := results[k].GetChunkLoss()
		if next[k] >= len(ls) {
			return 0, 0, fmt.Errorf("stage %d sent %d chunk losses, fewer than it ran", k, len(ls))
		}
		loss += ls[next[k]]
		next[k]++
	}
	for k, d := range results {
		if n := len(d.GetChunkLoss()); n != next[k] {
			return 0, 0, fmt.Errorf("stage %d sent %d chunk losses for %d chunks", k, n, next[k])
		}
	}
	if seen != int64(labels) {
		return 0, 0, fmt.Errorf("the loss stages saw %d test labels of %d", seen, labels)
	}
	return float64(correct) / float64(labels), loss / mass, nil
}
