package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/linkprobe"
)

// Link probes: every node answers probes on its data-plane
// host (gossip tag "probe"); a coordinator measures the link from node a
// to node b by asking a, through POST /v1/links/probe, to probe b.

// LinkProbeRequest asks a node to probe its link to the member To (a node
// name: the API probes members only).
type LinkProbeRequest struct {
	To string `json:"to"`
}

// LinkProbeReply is a link's measurement.
type LinkProbeReply struct {
	From        string  `json:"from"`
	To          string  `json:"to"`
	BytesPerSec float64 `json:"bytes_per_s"`
	RTTMS       float64 `json:"rtt_ms"`
	TookMS      float64 `json:"took_ms"`
}

var errNotProbeable = errors.New("nodes: bad link probe")

// linkProbeTimeout bounds one probe (about 0.3 s on a working link), and
// linkAskTimeout asking another node for one: without it, a request to a
// node behind a cut link waits for the kernel's connect retries (about
// two minutes).
const (
	linkProbeTimeout = 20 * time.Second
	linkAskTimeout   = linkProbeTimeout + 5*time.Second
)

// links measures the links from this node and keeps what it measured.
// Its probe server answers the probes of other nodes.
type links struct {
	self    string
	log     *slog.Logger
	members *members
	server  *linkprobe.Server
	probeMu sync.Mutex // one link probe from this node at a time

	mu   sync.Mutex // guards kept
	kept map[[2]string]keptLink
}

// keptLink is a link measurement this node keeps for the jobs it
// coordinates.
type keptLink struct {
	m  core.LinkMeasure
	at time.Time
}

func newLinks(self string, log *slog.Logger, ms *members, server *linkprobe.Server) *links {
	return &links{self: self, log: log, members: ms, server: server, kept: map[[2]string]keptLink{}}
}

// probe is [Agent.ProbeLink].
func (l *links) probe(ctx context.Context, to string) (LinkProbeReply, error) {
	var addr string
	for _, n := range l.members.usable() {
		if n.Name == to {
			addr = n.ProbeAddr
		}
	}
	if addr == "" || to == l.self {
		return LinkProbeReply{}, fmt.Errorf("%w: %q is not another live member that answers probes", errNotProbeable, to)
	}
	l.probeMu.Lock()
	defer l.probeMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, linkProbeTimeout)
	defer cancel()
	r, err := linkprobe.Measure(ctx, addr, linkprobe.Options{})
	if err != nil {
		return LinkProbeReply{}, err
	}
	l.log.Debug("nodes: link probed", "to", to, "mbit_s", r.BytesPerSec*8/1e6, "rtt", r.RTT, "took", r.Took)
	return LinkProbeReply{From: l.self, To: to, BytesPerSec: r.BytesPerSec, RTTMS: job.Millis(r.RTT), TookMS: job.Millis(r.Took)}, nil
}

// MeasureLink is [Agent.MeasureLink] (the coordinators' LinkProber).
func (l *links) MeasureLink(ctx context.Context, from, to job.NodeInfo, maxAge time.Duration) (core.LinkMeasure, error) {
	k := [2]string{from.Name, to.Name}
	l.mu.Lock()
	kept, ok := l.kept[k]
	l.mu.Unlock()
	if ok && maxAge > 0 && time.Since(kept.at) <= maxAge {
		return kept.m, nil
	}
	var r LinkProbeReply
	var err error
	if from.Name == l.self {
		r, err = l.probe(ctx, to.Name)
	} else {
		addr := l.members.lastHTTP(from.Name)
		if addr == "" {
			return core.LinkMeasure{}, fmt.Errorf("nodes: no HTTP address for %s", from.Name)
		}
		ctx, cancel := context.WithTimeout(ctx, linkAskTimeout)
		r, err = l.members.client(addr).ProbeLink(ctx, to.Name)
		cancel()
	}
	if err != nil {
		return core.LinkMeasure{}, err
	}
	m := core.LinkMeasure{From: from.Name, To: to.Name, BytesPerSec: r.BytesPerSec, RTT: time.Duration(r.RTTMS * float64(time.Millisecond))}
	l.mu.Lock()
	l.kept[k] = keptLink{m, time.Now()}
	l.mu.Unlock()
	return m, nil
}

func (h *api) postLinkProbe(w http.ResponseWriter, r *http.Request) {
	var req LinkProbeRequest
	if !decodeJSON(w, r, &req, errNotProbeable) {
		return
	}
	rep, err := h.a.ProbeLink(r.Context(), req.To)
	if err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, errNotProbeable) {
			code = http.StatusBadRequest
		}
		writeError(w, code, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// ProbeLink asks the node to measure its link to the member to (POST
// /v1/links/probe).
func (c *Client) ProbeLink(ctx context.Context, to string) (LinkProbeReply, error) {
	var rep LinkProbeReply
	err := c.do(ctx, http.MethodPost, "/v1/links/probe", LinkProbeRequest{To: to}, &rep)
	return rep, err
}
