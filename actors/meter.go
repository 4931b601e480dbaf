package actors

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/job/core"
)

// JobMeter is what a coordinator has measured of its job since it was
// created, for monitoring (a node's /metrics): counts and sums that only
// grow, each updated once per step or cut (a successor that takes a job
// over starts its own). [Coordinator.Meter] returns a copy.
type JobMeter struct {
	// Steps are the durations of the steps completed (those replayed
	// after a recovery included), from asking the stages for the step to
	// the last one's answer. Its Count is the steps that the job's status
	// counts in Step, plus the replayed ones.
	Steps Histogram
	// Cuts are the pipeline's pauses to gather the stages' state into a
	// cut; Persists the writing and copying of each cut in the
	// background (failed ones included).
	Cuts, Persists Histogram
	// Stages is what each stage measured of the steps it ran, by stage
	// (of the plan at the time) and node, sorted.
	Stages []StageMeter
}

// StageMeter sums what a job's stage on one node measured of its steps.
type StageMeter struct {
	Stage int
	Node  string
	Steps int64
	// Forward, Backward and Update are the stage's compute; Wait its
	// time waiting for its peers' tensors.
	Forward, Backward, Update, Wait time.Duration
}

// Histogram counts durations in buckets.
type Histogram struct {
	// Bounds are the buckets' upper bounds in seconds, ascending; Counts
	// has a count for each (of the durations above the bound before and
	// up to it) and one more for those above the last.
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// meterBounds are the buckets of a job's durations, in seconds: steps of
// a few milliseconds to minutes.
var meterBounds = [...]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25, 60, 150, 300}

// histogram counts durations in meterBounds (a Histogram without its
// slices' allocations).
type histogram struct {
	counts [len(meterBounds) + 1]uint64
	count  uint64
	sum    time.Duration
}

func (h *histogram) observe(d time.Duration) {
	i, _ := slices.BinarySearch(meterBounds[:], d.Seconds())
	h.counts[i]++
	h.count++
	h.sum += d
}

func (h *histogram) export() Histogram {
	return Histogram{Bounds: slices.Clone(meterBounds[:]), Counts: slices.Clone(h.counts[:]), Count: h.count, Sum: h.sum}
}

// jobMeter is a coordinator's JobMeter as it counts.
type jobMeter struct {
	mu                    sync.Mutex // guards the rest
	steps, cuts, persists histogram
	stages                map[stageKey]*StageMeter
}

type stageKey struct {
	stage int
	node  string
}

// step counts a step of took on the stages of s, with what each measured.
func (m *jobMeter) step(took time.Duration, s *stageSet, timings []core.StageTiming) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.steps.observe(took)
	if s == nil {
		return
	}
	for k, t := range timings {
		if k >= len(s.plan.Stages) {
			break
		}
		key := stageKey{k, s.plan.Stages[k].Node}
		sm := m.stages[key]
		if sm == nil {
			if m.stages == nil {
				m.stages = map[stageKey]*StageMeter{}
			}
			sm = &StageMeter{Stage: key.stage, Node: key.node}
			m.stages[key] = sm
		}
		sm.Steps++
		sm.Forward += t.Forward
		sm.Backward += t.Backward
		sm.Update += t.Update
		sm.Wait += t.Wait
	}
}

func (m *jobMeter) cut(took time.Duration) {
	m.mu.Lock()
	m.cuts.observe(took)
	m.mu.Unlock()
}

func (m *jobMeter) persist(took time.Duration) {
	m.mu.Lock()
	m.persists.observe(took)
	m.mu.Unlock()
}

func (m *jobMeter) export() JobMeter {
	m.mu.Lock()
	defer m.mu.Unlock()
	jm := JobMeter{Steps: m.steps.export(), Cuts: m.cuts.export(), Persists: m.persists.export()}
	for _, sm := range m.stages {
		jm.Stages = append(jm.Stages, *sm)
	}
	slices.SortFunc(jm.Stages, func(a, b StageMeter) int {
		return cmp.Or(cmp.Compare(a.Stage, b.Stage), cmp.Compare(a.Node, b.Node))
	})
	return jm
}

// Meter returns what the coordinator has measured of its job so far. It
// is safe for concurrent use and cheap (a copy of a few counters per
// stage).
func (c *Coordinator) Meter() JobMeter { return c.meter.export() }
