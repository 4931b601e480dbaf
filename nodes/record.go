package nodes

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// JobRecord is what the nodes holding copies of a job know about it: enough
// for one of them to take the job over when its coordinator's node dies
// (see the package documentation, "Coordinator failover"). The coordinator
// sends it to the holders at submission, with every cut and when the job
// ends (PUT /v1/jobrecords/{id}).
type JobRecord struct {
	ID string `json:"id"`
	// Run tells this run of the job (one submission, with its takeovers)
	// from earlier runs under the same id: a nonce drawn at submission
	// and kept by takeovers. The cuts of the run carry it (the replicas
	// in their metadata, job.CutMeta.Run), and a successor only resumes
	// from cuts of its record's run (see cuts.go).
	Run string `json:"run"`
	// Spec is the job's checked spec (its ID is ID), checked where the
	// record is decoded.
	Spec job.Checked `json:"spec"`
	// Coordinator is the node that runs the job; Holders are the other
	// nodes that keep this record and a copy of every cut (at most
	// Spec.Replicas-1 of them).
	Coordinator string   `json:"coordinator"`
	Holders     []string `json:"holders"`
	// Generation is the newest plan generation the coordinator is known to
	// have used. Its high 32 bits are the coordinator's term: every
	// takeover starts a new term, so the successor's plans are newer than
	// anything its predecessor sent (see nextTerm).
	Generation uint64 `json:"generation"`
	// Revision counts the coordinator's updates within its term.
	Revision uint64 `json:"revision"`
	// State is running, done or failed; a failed job has Error, a done
	// one Result.
	State  RecordState `json:"state"`
	Error  string      `json:"error,omitempty"`
	Result *job.Result `json:"result,omitempty"`
	// Takeovers are the job's coordinator changes, oldest first.
	Takeovers []Takeover `json:"takeovers,omitempty"`
	// Cuts name the run's latest cuts that reached the holders, newest
	// last (at most CheckpointsKept): a successor resumes only from a copy
	// whose step and digest are listed (see cutDigest).
	Cuts []CutDigest `json:"cuts,omitempty"`
}

// CutDigest names one cut of a job's run: its step and the SHA-256 of its
// canonical encoding, in hex (cutDigest).
type CutDigest struct {
	Step   int64  `json:"step"`
	SHA256 string `json:"sha256"`
}

// digestOf returns the digest the record lists for the cut at step.
func (r *JobRecord) digestOf(step int64) (string, bool) {
	for _, c := range r.Cuts {
		if c.Step == step {
			return c.SHA256, true
		}
	}
	return "", false
}

// cutSteps are the steps of the cuts the record lists.
func (r *JobRecord) cutSteps() []int64 {
	out := make([]int64, len(r.Cuts))
	for i, c := range r.Cuts {
		out[i] = c.Step
	}
	return out
}

// addCut lists the cut at step with digest sum as the newest, keeping the
// last CheckpointsKept.
func (r *JobRecord) addCut(step int64, sum string) {
	r.Cuts = slices.DeleteFunc(r.Cuts, func(c CutDigest) bool { return c.Step >= step })
	r.Cuts = append(r.Cuts, CutDigest{Step: step, SHA256: sum})
	if n := len(r.Cuts); n > CheckpointsKept {
		r.Cuts = slices.Delete(r.Cuts, 0, n-CheckpointsKept)
	}
}

// RecordState is a job's state as its record says: running, or how it
// ended.
type RecordState string

// States of a [JobRecord].
const (
	RecordRunning RecordState = "running"
	RecordDone    RecordState = "done"
	RecordFailed  RecordState = "failed"
)

// Takeover is one change of a job's coordinator after its node died.
type Takeover struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Step is the cut the successor resumed from (0: it restarted the
	// job, no cut being available); Source says where that cut was read.
	Step       int64     `json:"step"`
	Source     string    `json:"source"`
	Generation uint64    `json:"generation"`
	At         time.Time `json:"at"`
	// PrepareMS is the time from the successor's decision to take the job
	// over to its coordinator being ready to start the stages (finding
	// and verifying the cut, loading the data, profiling, planning).
	PrepareMS float64 `json:"prepare_ms"`
}

// Errors about job records.
var (
	ErrRecord      = errors.New("nodes: bad job record")
	ErrStaleRecord = errors.New("nodes: stale job record")
)

// MaxNameBytes bounds a node name (see CheckName).
const MaxNameBytes = 256

// Bounds of a job record.
const (
	maxErrorBytes = 4096
	maxTakeovers  = 64
	maxRunBytes   = 64
	maxCutDigests = 16
	// termShift places a coordinator's term in the high bits of a plan
	// generation.
	termShift = 32
)

func recordErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrRecord, fmt.Sprintf(format, a...))
}

// checkRun checks a run nonce that came from the network or from a
// checkpoint file.
func checkRun(run string) error {
	if run == "" || len(run) > maxRunBytes || strings.ContainsFunc(run, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) {
		return fmt.Errorf("run %q: want 1 to %d letters, digits, '-' or '_'", run, maxRunBytes)
	}
	return nil
}

// newRun draws the run nonce of a new submission.
func newRun() string { return rand.Text() }

// CheckName is the one rule for a node name: 1 to MaxNameBytes bytes of
// UTF-8 without control characters (a newline, a tab). Job records are
// checked with it, and so is a node's own name (Config.Name, join --name):
// a node every record holder would refuse to name would get no replicas.
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameBytes || !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl) ||
		strings.ContainsAny(name, balance.NameSpecials) {
		return fmt.Errorf("node name %s: want 1 to %d bytes of UTF-8 without control characters or any of %q", quoteName(name), MaxNameBytes, balance.NameSpecials)
	}
	return nil
}

// quoteName quotes a name for an error, cut short if it is long.
func quoteName(name string) string {
	const show = 48
	if len(name) <= show {
		return strconv.Quote(name)
	}
	return fmt.Sprintf("%q... (%d bytes)", name[:show], len(name))
}

// checkName checks a node name of a record that came from the network.
func checkName(what, name string) error {
	if err := CheckName(name); err != nil {
		return recordErr("%s: %v", what, err)
	}
	return nil
}

// Validate checks a record that came from the network or from disk (its
// spec was checked as it was decoded).
func (r *JobRecord) Validate() error {
	if err := checkID(r.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrRecord, err)
	}
	if err := checkRun(r.Run); err != nil {
		return fmt.Errorf("%w: %w", ErrRecord, err)
	}
	if r.Spec.ID() != r.ID {
		return recordErr("spec of job %q in the record of job %q", r.Spec.ID(), r.ID)
	}
	if err := checkName("coordinator", r.Coordinator); err != nil {
		return err
	}
	if len(r.Holders) > r.replicas()-1 {
		return recordErr("%d holders for %d replicas (at most replicas-1 besides the coordinator)", len(r.Holders), r.replicas())
	}
	for i, h := range r.Holders {
		if err := checkName("holder", h); err != nil {
			return err
		}
		if h == r.Coordinator {
			return recordErr("the coordinator %q is also a holder", h)
		}
		if slices.Contains(r.Holders[:i], h) {
			return recordErr("holder %q is listed twice", h)
		}
	}
	if r.Generation == 0 {
		return recordErr("generation 0 (plan generations start at 1)")
	}
	switch r.State {
	case RecordRunning, RecordFailed:
		if r.Result != nil {
			return recordErr("a %s job with a result", r.State)
		}
	case RecordDone:
		if r.Result == nil {
			return recordErr("a done job without a result")
		}
	default:
		return recordErr("state %q: want %s, %s or %s", r.State, RecordRunning, RecordDone, RecordFailed)
	}
	if len(r.Error) > maxErrorBytes {
		return recordErr("error message of %d bytes (at most %d)", len(r.Error), maxErrorBytes)
	}
	if len(r.Takeovers) > maxTakeovers {
		return recordErr("%d takeovers (at most %d)", len(r.Takeovers), maxTakeovers)
	}
	if len(r.Cuts) > maxCutDigests {
		return recordErr("%d cut digests (at most %d)", len(r.Cuts), maxCutDigests)
	}
	for _, c := range r.Cuts {
		if c.Step < 0 || len(c.SHA256) != 2*sha256.Size || strings.Trim(c.SHA256, "0123456789abcdef") != "" {
			return recordErr("cut at step %d: want a non-negative step and a SHA-256 of %d lowercase hex digits", c.Step, 2*sha256.Size)
		}
	}
	for _, t := range r.Takeovers {
		if err := checkName("takeover from", t.From); err != nil {
			return err
		}
		if err := checkName("takeover to", t.To); err != nil {
			return err
		}
		if t.Step < 0 || len(t.Source) > maxErrorBytes {
			return recordErr("takeover at step %d from %d bytes of source", t.Step, len(t.Source))
		}
	}
	return nil
}

// replicas is the number of copies of the job's cuts and record.
func (r *JobRecord) replicas() int { return r.Spec.Spec().Replicas }

// clone returns a deep copy of r (the parts that are changed in place).
func (r JobRecord) clone() JobRecord {
	r.Holders = slices.Clone(r.Holders)
	r.Takeovers = slices.Clone(r.Takeovers)
	r.Cuts = slices.Clone(r.Cuts)
	if r.Result != nil {
		res := *r.Result
		res.Nodes = slices.Clone(res.Nodes)
		r.Result = &res
	}
	return r
}

// term is the coordinator term of a plan generation.
func term(gen uint64) uint64 { return gen >> termShift }

// nextTerm is the first plan generation of a coordinator that takes over a
// job whose predecessors used generations up to the largest of gens: the
// first of the next term. A coordinator changes its plan far fewer than
// 2^32 times, so the successor's generations are above all of its
// predecessor's, including those it used after the record was last sent.
func nextTerm(gens ...uint64) uint64 {
	return (term(slices.Max(append(gens, 0))) + 1) << termShift
}

// supersedes reports whether record r may replace record old of the same
// job: it is of a later coordinator term, or of the same term and not an
// older revision (a repeated update is accepted again).
func (r *JobRecord) supersedes(old *JobRecord) bool {
	if t, o := term(r.Generation), term(old.Generation); t != o {
		return t > o
	}
	return r.Revision >= old.Revision
}

// successor is the node that takes over the job of record r, whose
// coordinator is gone: the holder with the smallest name among those
// usable reports usable. Every holder computes it from the same record and
// (once gossip settles) the same membership, so they agree without
// talking. It returns "" if no holder is usable.
func successor(r *JobRecord, usable func(name string) bool) string {
	best := ""
	for _, h := range r.Holders {
		if usable(h) && (best == "" || h < best) {
			best = h
		}
	}
	return best
}

// chooseHolders picks the n nodes that keep copies of a job: those of
// current that are still candidates, in their order, then the other
// candidates (sorted by name), the first first. Keeping the current
// holders avoids moving copies when a node joins; filling up by name makes
// the choice deterministic.
func chooseHolders(current, candidates []string, n int) []string {
	out := []string{}
	for _, h := range current {
		if len(out) < n && slices.Contains(candidates, h) && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	for _, h := range candidates {
		if len(out) < n && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}
