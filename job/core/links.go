package core

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// The network as the core knows it: every link between two
// nodes that a plan uses or may use is probed when its nodes become
// candidates (a Probe action at a plan change, or at a step boundary for
// a node that joined). While the job trains, the frames the stages send
// tell how long the link made them wait: a sender that waited w seconds
// in its writes for b bytes saw the path carry at most b/w. When that
// bound stays well below the planned rate (another program shares the
// link), or the steps take much longer than the plan predicts, the plan's
// links are probed again at a step boundary (the bound alone cannot tell
// a slow link from a receiver starved of CPU). A link that got faster
// makes nobody wait, so every link is probed again every refreshEvery,
// within probeShare of the training time. The measured rates reach the
// planner the way measured node speeds do.

// Link-tracking constants.
const (
	// passiveBytes is the traffic a passive bound needs (smaller samples
	// are dominated by the sockets' buffers).
	passiveBytes = 512 << 10
	// boundSlower is the factor by which the traffic's bound must stay
	// below the planned rate for linkStreak bounds in a row to probe the
	// link again (senders also wait for receivers short of CPU: on 1
	// Gbit/s links shared with busy stages the bound was 0.2 to 0.5 of the
	// rate); a probe that finds the rate changed by linkSlower or
	// linkFaster changes the plan's links.
	boundSlower = 0.15
	// boundSteps is how much slower than the plan's first steps the last
	// ones must be for a low bound to count: on fast links the senders
	// wait for busy receivers, and a slow link that matters slows the steps.
	boundSteps = 1.25
	// boundWait is the share of a step the senders must have waited on a
	// link for its bound to count: a link that holds them up for less
	// cannot be what slows the steps.
	boundWait  = 0.1
	linkSlower = 0.5
	linkFaster = 1.5
	linkStreak = 2
	// refreshEvery is the age at which a link is probed again anyway, if
	// the probes so far took less than probeShare of the training time.
	refreshEvery = 2 * time.Minute
	// reprobeAfter is the least time between two probes of a link, and
	// probeShare (of the training time, plus probeAllowance when the
	// traffic or the steps asked) bounds the time spent probing while
	// training.
	reprobeAfter   = time.Second
	probeShare     = 0.005
	probeAllowance = time.Second
	// loopbackRate is the planned speed between stages of one node.
	loopbackRate = 10e9
)

// linkState is one directed link between two nodes.
type linkState struct {
	rate, rtt float64 // bytes/s and seconds, as planned
	// source: "probe" once measured.
	source   string
	probedAt time.Time
	// The passive estimate: bytes and write time accumulated until
	// passiveBytes, the streaks of low and high bounds.
	accBytes int64
	accWrite time.Duration
	accSteps int
	slow     int
	bound    float64 // the last bound
	kinds    map[string]*kindSent
	reprobe  bool      // probe it again at the next boundary
	tried    time.Time // the last probe asked for
}

// linkTable is every link the job knows, with what probing them cost.
type linkTable struct {
	m map[[2]string]*linkState // by sending and receiving node
	// probeSpent is the time spent probing links while training;
	// slowChecks counts the checks in a row that found the steps slow.
	probeSpent time.Duration
	slowChecks int
	// noProbe says the job probes no link (Spec.NoProbe); inputs are the
	// codec estimates of a micro-batch of inputs if codecs are chosen
	// automatically (see Config.Inputs).
	noProbe bool
	inputs  []tensorio.Estimate
}

// kindSent totals what a link carried of one kind.
type kindSent struct {
	codec             string
	frames, raw, wire int64
	encode, sample    time.Duration
}

// get returns the link from one node to another, made if new.
func (t *linkTable) get(from, to string) *linkState {
	k := [2]string{from, to}
	l := t.m[k]
	if l == nil {
		l = &linkState{kinds: map[string]*kindSent{}}
		t.m[k] = l
	}
	return l
}

// rate is the planned speed of the link from one node to another:
// measured, or the default link's.
func (t *linkTable) rate(from, to string) float64 {
	if from == to {
		return loopbackRate
	}
	if l := t.m[[2]string{from, to}]; l != nil && l.rate > 0 {
		return l.rate
	}
	return balance.DefaultLink.Bandwidth
}

// unmeasured lists the links between the nodes that have no measurement,
// or that traffic asked to probe again, and were not asked for within
// reprobeAfter (a node that does not answer probes is not asked at every
// step).
func (t *linkTable) unmeasured(now time.Time, nodes []job.NodeInfo) [][2]string {
	if t.noProbe {
		return nil
	}
	names := []string{}
	for _, n := range nodes {
		if n.ProbeAddr != "" {
			names = append(names, n.Name)
		}
	}
	var out [][2]string
	for _, a := range names {
		for _, b := range names {
			if a == b {
				continue
			}
			l := t.m[[2]string{a, b}]
			if l != nil && l.source != "" && !l.reprobe || l != nil && !l.tried.IsZero() && now.Sub(l.tried) < reprobeAfter {
				continue
			}
			out = append(out, [2]string{a, b})
		}
	}
	return out
}

// probeDue returns the links to probe at this boundary while training:
// those never measured; those the traffic or the steps asked for, within
// probeAllowance plus probeShare of the training time; and, within
// probeShare alone, those measured more than refreshEvery ago.
func (c *Core) probeDue(now time.Time) [][2]string {
	t := &c.links
	pairs := t.unmeasured(now, c.nodes.candidates())
	share := time.Duration(probeShare * float64(c.steps.run))
	if t.probeSpent > probeAllowance+share {
		pairs = slices.DeleteFunc(pairs, func(p [2]string) bool {
			l := t.m[p]
			return l != nil && l.source != ""
		})
	}
	if len(pairs) > 0 || t.noProbe || t.probeSpent > share {
		return pairs
	}
	members := c.nodes.members
	for _, k := range slices.SortedFunc(maps.Keys(t.m), cmpPair) {
		if l := t.m[k]; l.source != "" && now.Sub(l.probedAt) >= refreshEvery && members[k[0]].ProbeAddr != "" && members[k[1]].ProbeAddr != "" {
			pairs = append(pairs, k)
		}
	}
	return pairs
}

// LinkMaxAge is how old a measurement of a link may be for a job that
// meets the link for the first time (the nodes keep them): links change
// more slowly than jobs start.
const LinkMaxAge = refreshEvery

// probeLinks asks for the probe of links: they count as tried. It reports
// whether one of them was measured before (the probe must be fresh).
func (t *linkTable) probeLinks(now time.Time, pairs [][2]string) (fresh bool) {
	for _, p := range pairs {
		l := t.get(p[0], p[1])
		fresh = fresh || l.source != ""
		l.tried = now
	}
	return fresh
}

// probed records link measurements.
func (t *linkTable) probed(now time.Time, ms []LinkMeasure, log *slog.Logger) {
	for _, m := range ms {
		if !(m.BytesPerSec > 0) {
			continue
		}
		l := t.get(m.From, m.To)
		l.rate, l.rtt, l.source, l.probedAt = m.BytesPerSec, m.RTT.Seconds(), "probe", now
		l.reprobe, l.slow, l.accBytes, l.accWrite, l.accSteps = false, 0, 0, 0, 0
		log.Info("link measured", "from", m.From, "to", m.To, "mbit_s", m.BytesPerSec*8/1e6, "rtt_ms", job.Millis(m.RTT))
	}
}

func changedRate(old, v float64) bool { return v < linkSlower*old || v > linkFaster*old }

// observeLinks accounts a step's traffic to its links and checks their
// passive bounds.
func (c *Core) observeLinks(now time.Time, timings []StageTiming, feeds []LinkSent) {
	type sent struct {
		bytes int64
		write time.Duration
	}
	step := map[[2]string]*sent{}
	add := func(from int, ls []LinkSent) {
		src, ok := c.plan.node(from, c.cfg.Self)
		if !ok {
			return
		}
		for _, s := range ls {
			dst, ok := c.plan.node(s.Peer, c.cfg.Self)
			if !ok || dst == src {
				continue
			}
			l := c.links.get(src, dst)
			ks := l.kinds[s.Kind]
			if ks == nil {
				ks = &kindSent{}
				l.kinds[s.Kind] = ks
			}
			ks.codec = s.Codec
			ks.frames += s.Frames
			ks.raw += s.RawBytes
			ks.wire += s.WireBytes
			ks.encode += s.Encode
			ks.sample += s.Sample
			k := [2]string{src, dst}
			if step[k] == nil {
				step[k] = &sent{}
			}
			step[k].bytes += s.WireBytes
			step[k].write += s.Write
		}
	}
	for k, t := range timings {
		add(k, t.Links)
	}
	add(balance.Coordinator, feeds)
	for k, s := range step {
		l := c.links.m[k]
		l.accBytes += s.bytes
		l.accWrite += s.write
		l.accSteps++
		if l.accBytes < passiveBytes {
			continue
		}
		bound := float64(l.accBytes) / max(l.accWrite.Seconds(), 1e-9)
		waited := l.accWrite.Seconds() / float64(l.accSteps)
		l.accBytes, l.accWrite, l.accSteps, l.bound = 0, 0, 0, bound
		rate := c.links.rate(k[0], k[1])
		times := c.steps.times
		if bound >= boundSlower*rate || len(times) > 0 && waited < boundWait*times[len(times)-1] {
			l.slow = 0
			continue
		}
		if l.slow++; l.slow >= linkStreak && !l.reprobe && now.Sub(l.probedAt) >= reprobeAfter && c.steps.slowedBy() >= boundSteps {
			c.log.Info("the link is slower than planned: probing it again", "from", k[0], "to", k[1],
				"planned_mbit_s", rate*8/1e6, "traffic_bound_mbit_s", bound*8/1e6)
			l.reprobe, l.slow = true, 0
		}
	}
}

// changed names a link whose measured rate left the one the plan for cl
// was made with by linkSlower or linkFaster ("a->b now 50 Mbit/s"), or "".
func (t *linkTable) changed(cl *balance.Cluster) string {
	if cl == nil {
		return ""
	}
	for _, lp := range cl.Links {
		if l := t.m[[2]string{lp.From, lp.To}]; l != nil && changedRate(lp.Bandwidth, l.rate) {
			return fmt.Sprintf("%s->%s now %.0f Mbit/s", lp.From, lp.To, l.rate*8/1e6)
		}
	}
	return ""
}

// linksMatter reports whether the links as measured now, rather than as
// the plan was made with, move the plan's predicted step (step, on cl) by
// more than 5%: a re-plan is the links' doing only then.
func (c *Core) linksMatter(cl *balance.Cluster, step float64) bool {
	if c.plan.cl == nil {
		return true
	}
	then := *cl
	then.Links, then.DefaultLink = c.plan.cl.Links, c.plan.cl.DefaultLink
	r, err := balance.Simulate(c.plan.Plan, c.job.Graph, c.cfg.Profile, &then, balance.SimOptions{Optimizer: c.job.Spec.Optimizer})
	return err != nil || math.Abs(r.StepTime-step) > 0.05*step
}

func cmpPair(a, b [2]string) int {
	if r := strings.Compare(a[0], b[0]); r != 0 {
		return r
	}
	return strings.Compare(a[1], b[1])
}

// slowSteps is how far the measured steps may exceed the plan's prediction
// at the measured speeds, and slowerSteps the plan's own first steps,
// before the plan's links are probed again: small transfers fit in the
// sockets' buffers and never make a sender wait, but a slow link still
// shows in the step time. (A false alarm costs a probe, within budget.)
const (
	slowSteps   = 1.5
	slowerSteps = 1.4
)

// checkSlowSteps probes the plan's links again when the last steps took
// much longer than the plan predicts at the measured speeds and links, or
// than its first steps took, twice in a row.
func (c *Core) checkSlowSteps(now time.Time) {
	t, times := &c.links, c.steps.times
	if t.noProbe || len(times) < rebalanceEvery || c.steps.next%rebalanceEvery != 0 {
		return
	}
	cur, err := balance.Simulate(c.plan.Plan, c.job.Graph, c.cfg.Profile, c.clusterOf(c.nodes.candidates()), balance.SimOptions{Optimizer: c.job.Spec.Optimizer})
	if err != nil {
		return
	}
	med := balance.Median(times[len(times)-rebalanceEvery:])
	if med <= slowSteps*cur.StepTime && c.steps.slowedBy() <= slowerSteps {
		t.slowChecks = 0
		return
	}
	if t.slowChecks++; t.slowChecks < linkStreak {
		return
	}
	t.slowChecks = 0
	for _, a := range c.plan.Stages {
		for _, b := range c.plan.Stages {
			l := t.m[[2]string{a.Node, b.Node}]
			if l == nil || l.source == "" || l.reprobe || now.Sub(l.probedAt) < reprobeAfter {
				continue
			}
			c.log.Info("steps slower than predicted: probing the plan's links again", "from", a.Node, "to", b.Node,
				"measured_ms", med*1e3, "predicted_ms", cur.StepTime*1e3)
			l.reprobe = true
		}
	}
}

// stepRates are the planned speeds of the current plan's links, by sender
// and receiver stage, the coordinator's included.
func (c *Core) stepRates() map[[2]int]float64 {
	rates := map[[2]int]float64{}
	S := len(c.plan.Stages)
	for from := balance.Coordinator; from < S; from++ {
		for to := balance.Coordinator; to < S; to++ {
			if from == to {
				continue
			}
			a, ok1 := c.plan.node(from, c.cfg.Self)
			b, ok2 := c.plan.node(to, c.cfg.Self)
			if ok1 && ok2 {
				rates[[2]int{from, to}] = c.links.rate(a, b)
			}
		}
	}
	return rates
}

// profiles are the measured links between the nodes, for the planner,
// with what their codecs did to the activations and gradients they
// carried (or, for a link that carried none, all links did).
func (t *linkTable) profiles(nodes []balance.NodeProfile) []balance.LinkProfile {
	var out []balance.LinkProfile
	for _, a := range nodes {
		for _, b := range nodes {
			l := t.m[[2]string{a.Name, b.Name}]
			if a.Name == b.Name || l == nil || l.source == "" {
				continue
			}
			out = append(out, balance.LinkProfile{From: a.Name, To: b.Name, Bandwidth: l.rate, Latency: l.rtt / 2,
				Act: t.wireCost(l, kindActivation), Grad: t.wireCost(l, kindGradient), Input: t.wireCost(l, kindInput)})
		}
	}
	return out
}

// The kinds of tensors that cross the links between stages.
const (
	kindActivation = "activation"
	kindGradient   = "gradient"
	kindInput      = "input"
)

// wireMinBytes is the traffic of a kind a link must have carried for its
// own wire cost to count.
const wireMinBytes = 1 << 20

// wireCost is what codecs made of a kind of tensor on link l, or on all
// links if l carried too little of it; before any traffic, for inputs, the
// estimate of the codec l would choose, else nil. Decoding is taken to
// cost what encoding did.
func (t *linkTable) wireCost(l *linkState, kind string) *balance.WireCost {
	var ks kindSent
	if l != nil && l.kinds[kind] != nil && l.kinds[kind].raw >= wireMinBytes {
		ks = *l.kinds[kind]
	} else {
		for _, l := range t.m {
			if k := l.kinds[kind]; k != nil {
				ks.raw, ks.wire, ks.encode = ks.raw+k.raw, ks.wire+k.wire, ks.encode+k.encode
			}
		}
	}
	if ks.raw < wireMinBytes || ks.wire <= 0 {
		if kind == kindInput && len(t.inputs) > 0 {
			rate := balance.DefaultLink.Bandwidth
			if l != nil && l.rate > 0 {
				rate = l.rate
			}
			best := tensorio.Best(t.inputs, rate)
			for _, e := range t.inputs {
				if e.Codec == best {
					return &balance.WireCost{Ratio: min(e.Ratio, 2), Seconds: e.Fixed}
				}
			}
		}
		return nil
	}
	return &balance.WireCost{Ratio: min(float64(ks.wire)/float64(ks.raw), 2), Seconds: 2 * ks.encode.Seconds() / float64(ks.raw)}
}

// status describes the links the job knows, sorted.
func (t *linkTable) status() []job.LinkStatus {
	keys := slices.SortedFunc(maps.Keys(t.m), cmpPair)
	var out []job.LinkStatus
	for _, k := range keys {
		l := t.m[k]
		ls := job.LinkStatus{From: k[0], To: k[1], MbitPerSec: l.rate * 8 / 1e6, RTTMS: l.rtt * 1e3, Source: l.source}
		if l.source == "" {
			ls.MbitPerSec, ls.Source = balance.DefaultLink.Bandwidth*8/1e6, "default"
		}
		if l.bound > 0 {
			ls.TrafficMbitPerSec = l.bound * 8 / 1e6
		}
		if !l.probedAt.IsZero() {
			ls.ProbedAt = l.probedAt
		}
		for _, kind := range slices.Sorted(maps.Keys(l.kinds)) {
			ks := l.kinds[kind]
			ratio := 0.0
			if ks.wire > 0 {
				ratio = float64(ks.raw) / float64(ks.wire)
			}
			ls.Kinds = append(ls.Kinds, job.LinkKind{Kind: kind, Codec: ks.codec, Ratio: ratio, Frames: ks.frames,
				RawBytes: ks.raw, WireBytes: ks.wire, EncodeMS: job.Millis(ks.encode), SampleMS: job.Millis(ks.sample)})
			ls.WireBytes += ks.wire
		}
		out = append(out, ls)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].WireBytes > 0 && out[j].WireBytes == 0 })
	return out
}
