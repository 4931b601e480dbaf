package nodes

import (
	"bytes"
	"math"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
)

// GET /metrics serves the node's metrics in Prometheus's text format
// (version 0.0.4), to the same callers as GET /v1/status. Everything is
// computed when scraped, from the node's status ([Agent.Status]), the
// counters of the jobs it coordinates ([actors.Coordinator.Meter]) and of
// its data plane ([dataplane.TCP.Traffic]): training pays nothing per step
// beyond those counters. A job's metrics are on the node that coordinates
// it (the label job is its id); a successor that takes a job over starts
// its counters from zero, which Prometheus reads as a counter reset.
//
//	ppnode_build_info{version,revision,goversion}       gauge, 1
//	ppnode_cluster_members{state}                       gauge
//	ppnode_dataplane_{sent,received}_{bytes,frames}_total{peer}   counters
//	ppnode_conns_accepted_total{port}                   counter
//	ppnode_conns_refused_total{port,limit}              counter
//	ppnode_conns_handshake_timeouts_total{port}         counter
//	ppnode_actor_refused_total                          counter
//	ppnode_conns{port,state}                            gauge
//	ppnode_job_state{job,state}                         gauge, 1 for the current state
//	ppnode_job_steps_done{job}, ppnode_job_steps_planned{job}   gauges
//	ppnode_job_steps_total{job}                         counter, replays included
//	ppnode_job_step_seconds{job}                        histogram
//	ppnode_job_samples_per_second{job}                  gauge
//	ppnode_job_train_loss{job}                          gauge
//	ppnode_job_stage_busy_seconds_total{job,stage,node,phase}   counter
//	ppnode_job_stage_wait_seconds_total{job,stage,node}         counter
//	ppnode_job_recoveries_total{job}, ppnode_job_replayed_steps_total{job}
//	ppnode_job_replans_total{job,trigger}               counter
//	ppnode_job_cuts_total{job}                          counter
//	ppnode_job_cut_pause_seconds{job}, ppnode_job_cut_persist_seconds{job}   histograms
//	ppnode_job_link_sent_{bytes,frames}_total{job,from,to,kind}  counters
//
// The help texts below say what each counts.

// A metric family: its name, type and help text.
type family struct{ name, typ, help string }

// The families, in the order they are written.
var (
	famBuild   = family{"ppnode_build_info", "gauge", "Build of the ppnode binary (always 1): its version, VCS revision and Go version."}
	famMembers = family{"ppnode_cluster_members", "gauge", "Members of the cluster as this node sees them, by state (alive, leaving, left, failed)."}

	famDPSentBytes  = family{"ppnode_dataplane_sent_bytes_total", "counter", "Bytes of tensor frames (tags and headers included) this node's data-plane links wrote, by peer IP address."}
	famDPSentFrames = family{"ppnode_dataplane_sent_frames_total", "counter", "Tensor frames this node's data-plane links sent, by peer IP address."}
	famDPRecvBytes  = family{"ppnode_dataplane_received_bytes_total", "counter", "Bytes this node's data-plane links read after their handshakes, by peer IP address."}
	famDPRecvFrames = family{"ppnode_dataplane_received_frames_total", "counter", "Tensor frames this node's data-plane links received, by peer IP address."}

	famConnsAccepted = family{"ppnode_conns_accepted_total", "counter", "Connections a listening port (actor, data, probe, http) took."}
	famConnsRefused  = family{"ppnode_conns_refused_total", "counter", "Connections a listening port closed as soon as it accepted them, by the limit reached: per_ip (handshakes in progress from one address), handshakes (in progress from all), conns (held in all)."}
	famConnsTimeouts = family{"ppnode_conns_handshake_timeouts_total", "counter", "Connections a listening port closed because they had not completed their handshake in time."}
	famRolesRefused  = family{"ppnode_actor_refused_total", "counter", "Streams, calls and messages the actor port refused by role: a peer without a node certificate, a stage's control from a node other than its coordinator."}
	famConns         = family{"ppnode_conns", "gauge", "Connections a listening port holds, by state (handshake: still in their handshake; established)."}

	famJobState    = family{"ppnode_job_state", "gauge", "State of each job this node coordinates: 1 for its current state, 0 for the others."}
	famStepsDone   = family{"ppnode_job_steps_done", "gauge", "Steps of the job done (as its status's step: back to the latest cut after a recovery)."}
	famStepsPlan   = family{"ppnode_job_steps_planned", "gauge", "Steps the job trains for in all."}
	famSteps       = family{"ppnode_job_steps_total", "counter", "Steps the job completed, those replayed after a recovery included."}
	famStepSeconds = family{"ppnode_job_step_seconds", "histogram", "Duration of the job's completed steps, from asking the stages for a step to the last one's answer."}
	famSamples     = family{"ppnode_job_samples_per_second", "gauge", "Training samples per second of the job, over its training time so far."}
	famLoss        = family{"ppnode_job_train_loss", "gauge", "Mean training loss of the job's last step."}
	famStageBusy   = family{"ppnode_job_stage_busy_seconds_total", "counter", "Time a stage of the job computed, by stage, node and phase (forward, backward, update), as the stages measured it."}
	famStageWait   = family{"ppnode_job_stage_wait_seconds_total", "counter", "Time a stage of the job waited on the data plane (for its peers' tensors, or for its own to leave at the step's end), by stage and node, as the stages measured it."}
	famStageMicros = family{"ppnode_job_stage_micro_batches", "gauge", "Micro-batches of each step a stage runs, by stage, the group of replicas it belongs to and node (all of them without replicas)."}
	famRecoveries  = family{"ppnode_job_recoveries_total", "counter", "Recoveries of the job from a failure (back to its latest cut)."}
	famReplayed    = family{"ppnode_job_replayed_steps_total", "counter", "Steps of the job run again after recoveries."}
	famReplans     = family{"ppnode_job_replans_total", "counter", "Re-plans of the running job, by trigger (speeds, links, joined, leaving, requested)."}
	famCuts        = family{"ppnode_job_cuts_total", "counter", "Consistent cuts of the job (written and copied, when the job keeps them on disk)."}
	famCutPause    = family{"ppnode_job_cut_pause_seconds", "histogram", "Pause of the job's pipeline to gather each cut from its stages."}
	famCutPersist  = family{"ppnode_job_cut_persist_seconds", "histogram", "Time to write and copy each of the job's cuts, in the background."}
	famLinkBytes   = family{"ppnode_job_link_sent_bytes_total", "counter", "Bytes the job sent over the data-plane link from one node to another, by kind of tensor."}
	famLinkFrames  = family{"ppnode_job_link_sent_frames_total", "counter", "Tensor frames the job sent over the data-plane link from one node to another, by kind of tensor."}
)

// The label values written even when nothing has them yet (a rate of 0
// rather than no series).
var (
	memberStates = []MemberState{MemberAlive, MemberLeaving, MemberLeft, MemberFailed}
	jobStates    = []job.State{job.StatePlanning, job.StateStarting, job.StateTraining, job.StateRecovering, job.StatePaused,
		job.StateEvaluating, job.StateDone, job.StateFailed, job.StateDiverged}
	replanTriggers = []job.Trigger{job.TriggerSpeeds, job.TriggerLinks, job.TriggerJoined, job.TriggerLeaving, job.TriggerRequested}
)

// buildRevision is the VCS revision the binary was built from ("-dirty"
// with uncommitted changes), or "unknown".
var buildRevision = func() string {
	rev, dirty := "unknown", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty && rev != "unknown" {
		rev += "-dirty"
	}
	return rev
}()

// jobMeter is a job this node coordinates, with what its coordinator
// measured.
type jobMeter struct {
	st JobStatus
	m  actors.JobMeter
}

// getMetrics answers GET /metrics.
func (h *api) getMetrics(w http.ResponseWriter, r *http.Request) {
	st := h.a.Status()
	meters := h.a.jobs.meters()
	jobs := make([]jobMeter, 0, len(st.Jobs))
	for _, js := range st.Jobs {
		jobs = append(jobs, jobMeter{st: js, m: meters[js.ID]})
	}
	var e exposition
	writeMetrics(&e, st, jobs, h.a.dp.Traffic(), h.a.gates.stats(h.a.sys.Refused()))
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	w.Write(e.b.Bytes())
}

// writeMetrics writes the node's metrics: st is its status, jobs the jobs
// it coordinates (in st.Jobs's order), traffic its data plane's and conns
// its listening ports' gates'.
func writeMetrics(e *exposition, st Status, jobs []jobMeter, traffic []dataplane.PeerTraffic, conns []portConns) {
	e.sample(famBuild, "", 1, "version", st.Version, "revision", buildRevision, "goversion", runtime.Version())

	byState := map[MemberState]int{}
	for _, m := range st.Members {
		byState[m.State]++
	}
	for _, s := range memberStates {
		e.sample(famMembers, "", float64(byState[s]), "state", string(s))
	}

	for _, f := range []struct {
		fam family
		v   func(dataplane.PeerTraffic) int64
	}{
		{famDPSentBytes, func(t dataplane.PeerTraffic) int64 { return t.SentBytes }},
		{famDPSentFrames, func(t dataplane.PeerTraffic) int64 { return t.SentFrames }},
		{famDPRecvBytes, func(t dataplane.PeerTraffic) int64 { return t.RecvBytes }},
		{famDPRecvFrames, func(t dataplane.PeerTraffic) int64 { return t.RecvFrames }},
	} {
		for _, t := range traffic {
			e.sample(f.fam, "", float64(f.v(t)), "peer", t.Peer)
		}
	}
	writeConnMetrics(e, conns)
	writeJobMetrics(e, jobs)
}

// writeConnMetrics writes what the gates of the listening ports counted.
func writeConnMetrics(e *exposition, conns []portConns) {
	for _, c := range conns {
		e.sample(famConnsAccepted, "", float64(c.stats.Accepted), "port", c.port)
	}
	for _, c := range conns {
		e.sample(famConnsRefused, "", float64(c.stats.RefusedPerIP), "port", c.port, "limit", "per_ip")
		e.sample(famConnsRefused, "", float64(c.stats.RefusedHandshakes), "port", c.port, "limit", "handshakes")
		e.sample(famConnsRefused, "", float64(c.stats.RefusedConns), "port", c.port, "limit", "conns")
	}
	for _, c := range conns {
		if c.port == "actor" {
			e.sample(famRolesRefused, "", float64(c.roles))
		}
	}
	for _, c := range conns {
		e.sample(famConnsTimeouts, "", float64(c.stats.TimedOut), "port", c.port)
	}
	for _, c := range conns {
		e.sample(famConns, "", float64(c.stats.InHandshake), "port", c.port, "state", "handshake")
		e.sample(famConns, "", float64(c.stats.Held-c.stats.InHandshake), "port", c.port, "state", "established")
	}
}

// writeJobMetrics writes the metrics of the jobs this node coordinates,
// family by family.
func writeJobMetrics(e *exposition, jobs []jobMeter) {
	perJob := func(f func(j jobMeter)) {
		for _, j := range jobs {
			f(j)
		}
	}
	perJob(func(j jobMeter) {
		for _, s := range jobStates {
			e.sample(famJobState, "", b2f(j.st.State == s), "job", j.st.ID, "state", string(s))
		}
	})
	perJob(func(j jobMeter) { e.sample(famStepsDone, "", float64(j.st.Step), "job", j.st.ID) })
	perJob(func(j jobMeter) { e.sample(famStepsPlan, "", float64(j.st.Total), "job", j.st.ID) })
	perJob(func(j jobMeter) { e.sample(famSteps, "", float64(j.m.Steps.Count), "job", j.st.ID) })
	perJob(func(j jobMeter) { e.histogram(famStepSeconds, j.m.Steps, "job", j.st.ID) })
	perJob(func(j jobMeter) { e.sample(famSamples, "", j.st.SamplesPerSec, "job", j.st.ID) })
	perJob(func(j jobMeter) { e.sample(famLoss, "", j.st.Loss, "job", j.st.ID) })
	perJob(func(j jobMeter) {
		for _, s := range j.m.Stages {
			stage := strconv.Itoa(s.Stage)
			e.sample(famStageBusy, "", s.Forward.Seconds(), "job", j.st.ID, "stage", stage, "node", s.Node, "phase", "forward")
			e.sample(famStageBusy, "", s.Backward.Seconds(), "job", j.st.ID, "stage", stage, "node", s.Node, "phase", "backward")
			e.sample(famStageBusy, "", s.Update.Seconds(), "job", j.st.ID, "stage", stage, "node", s.Node, "phase", "update")
		}
	})
	perJob(func(j jobMeter) {
		for _, s := range j.m.Stages {
			e.sample(famStageWait, "", s.Wait.Seconds(), "job", j.st.ID, "stage", strconv.Itoa(s.Stage), "node", s.Node)
		}
	})
	perJob(func(j jobMeter) {
		for _, s := range j.st.Stages {
			e.sample(famStageMicros, "", float64(s.MicroBatches), "job", j.st.ID, "stage", strconv.Itoa(s.ID), "group", strconv.Itoa(s.Group), "node", s.Node)
		}
	})
	perJob(func(j jobMeter) { e.sample(famRecoveries, "", float64(len(j.st.Recoveries)), "job", j.st.ID) })
	perJob(func(j jobMeter) {
		n := 0
		for _, r := range j.st.Recoveries {
			n += r.Replayed
		}
		e.sample(famReplayed, "", float64(n), "job", j.st.ID)
	})
	perJob(func(j jobMeter) {
		by := map[job.Trigger]int{}
		for _, r := range j.st.Replans {
			by[r.Trigger]++
		}
		triggers := slices.Clone(replanTriggers)
		for t := range by {
			if !slices.Contains(triggers, t) {
				triggers = append(triggers, t)
			}
		}
		for _, t := range triggers {
			e.sample(famReplans, "", float64(by[t]), "job", j.st.ID, "trigger", string(t))
		}
	})
	perJob(func(j jobMeter) { e.sample(famCuts, "", float64(j.st.Cuts), "job", j.st.ID) })
	perJob(func(j jobMeter) { e.histogram(famCutPause, j.m.Cuts, "job", j.st.ID) })
	perJob(func(j jobMeter) { e.histogram(famCutPersist, j.m.Persists, "job", j.st.ID) })
	for _, f := range []struct {
		fam family
		v   func(job.LinkKind) int64
	}{
		{famLinkBytes, func(k job.LinkKind) int64 { return k.WireBytes }},
		{famLinkFrames, func(k job.LinkKind) int64 { return k.Frames }},
	} {
		perJob(func(j jobMeter) {
			for _, l := range j.st.Links {
				for _, k := range l.Kinds {
					e.sample(f.fam, "", float64(f.v(k)), "job", j.st.ID, "from", l.From, "to", l.To, "kind", k.Kind)
				}
			}
		})
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// exposition is a body in Prometheus's text format. The samples of a
// family must be written one after the other: its HELP and TYPE lines
// come before the first.
type exposition struct {
	b   bytes.Buffer
	fam string // the family whose samples are being written
}

// sample writes one sample of f (of the series f.name+suffix: _bucket,
// _sum, _count for a histogram) with labels given as name, value pairs.
func (e *exposition) sample(f family, suffix string, v float64, labels ...string) {
	if e.fam != f.name {
		e.fam = f.name
		e.b.WriteString("# HELP " + f.name + " ")
		helpEscaper.WriteString(&e.b, f.help)
		e.b.WriteString("\n# TYPE " + f.name + " " + f.typ + "\n")
	}
	e.b.WriteString(f.name)
	e.b.WriteString(suffix)
	if len(labels) > 0 {
		e.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				e.b.WriteByte(',')
			}
			e.b.WriteString(labels[i])
			e.b.WriteString(`="`)
			labelEscaper.WriteString(&e.b, labels[i+1])
			e.b.WriteByte('"')
		}
		e.b.WriteByte('}')
	}
	e.b.WriteByte(' ')
	e.b.WriteString(formatValue(v))
	e.b.WriteByte('\n')
}

// histogram writes h as the cumulative buckets, sum (in seconds) and
// count of f.
func (e *exposition) histogram(f family, h actors.Histogram, labels ...string) {
	le := append(slices.Clip(labels), "le", "")
	var cum uint64
	for i, bound := range h.Bounds {
		if i < len(h.Counts) {
			cum += h.Counts[i]
		}
		le[len(le)-1] = formatValue(bound)
		e.sample(f, "_bucket", float64(cum), le...)
	}
	le[len(le)-1] = "+Inf"
	e.sample(f, "_bucket", float64(h.Count), le...)
	e.sample(f, "_sum", h.Sum.Seconds(), labels...)
	e.sample(f, "_count", float64(h.Count), labels...)
}

var (
	// In HELP lines a backslash and a line feed are escaped; in label
	// values a double quote too.
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// formatValue writes a sample value or a bucket bound as the text format
// does: Go's float syntax, +Inf, -Inf and NaN.
func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
