// Package nodes is one machine's agent (docs/DESIGN.md): it measures
// the machine at start, runs the actor system that hosts stages, joins the
// gossip membership, keeps the local checkpoint store and serves a small
// HTTP API through which jobs are submitted and watched.
//
// # Lifecycle
//
//	a, err := nodes.Start(nodes.Config{Name: "a", Bind: "10.0.0.1:7946", Seeds: seeds})
//	if err != nil { ... }
//	<-sigterm
//	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
//	defer cancel()
//	err = a.Leave(ctx) // others see a clean leave; then everything stops
//
// Start measures the node's GEMM speed (about 0.3 s), starts the actor
// system with the stage kind registered, opens the HTTP listener, and joins
// the cluster with metadata that carries the actor address, the profile and
// the HTTP address (tag "http"). Before a member memberlist declared failed
// is believed failed, the agent pings its actor port (cluster's
// Config.Confirm): a killed node refuses at once, a hung or cut-off one
// gets 2 s; one that answers (a node starved of CPU misses memberlist's
// 100 ms probes) stays a member and is asked again every 2 s until it
// refutes. A member confirmed failed, or gone, has its actor endpoint
// terminated, so that actors watching PIDs there receive Terminated
// (protoactor's remote has no keepalive), and its jobs recover.
//
// Leave and Close stop, in order: new submissions, the jobs this node
// coordinates (a job notices at its next step; its record is left
// running, so a holder takes it over, see below), the HTTP server, the
// membership, and the actor system; they return once every goroutine and
// listener of the agent is gone.
//
// # Parts
//
// The Agent wires parts that each keep their own state under their own
// lock; no part's lock is held while another's is taken. Start fills and
// checks the Config (config.go: withDefaults, validate, addrs), then
// starts the parts and what they run on (the actor system, the stage
// host, the data plane); the Agent's exported methods delegate to them.
//
//   - members (members.go): the membership view, every member's last
//     known HTTP address, a signal at each membership event, and the
//     client of the other nodes' APIs.
//   - jobs (jobs.go): the table of the jobs this node coordinates and of
//     the records it holds of jobs coordinated elsewhere. The two share
//     one lock because they share the job ids: reserving an id for a
//     submission, fencing a job on a newer record and handing a held
//     record over to a takeover are each one step. It counts the
//     reservations and runs that Close waits for, and does no I/O.
//   - runner (runner.go): the coordinator's side. It plans and launches
//     a job, replicates its cuts and record to the holders (it is the
//     coordinators' actors.Replicator), and tells them how it ended.
//   - failover (failover.go): the holder's side. It keeps the records
//     sent to this node and takes a job over when its coordinator dies.
//     Neither runner nor failover has state of its own: theirs is in
//     jobs.
//   - cuts (cuts.go): the local checkpoint store and the run each job's
//     cuts are of.
//   - links (links.go): the probe server, the lock that lets this node
//     probe one link at a time, and the measurements kept.
//   - capacity (cpulimit.go): the speed the CPU limit allows now.
//   - api (http.go and the files of its endpoints): the HTTP API, a thin
//     layer over the Agent and the parts. It owns its listener, server
//     and upload slots.
//
// # HTTP API
//
// All bodies are JSON. Errors are {"error": "..."} with a 4xx or 5xx code.
//
// With cluster credentials (Config.Identity; SECURITY.md) the API serves
// TLS and authorises by the client's certificate: the GETs of jobs and
// status need a certificate of the cluster or a client on loopback;
// submitting, cancelling and re-planning a client's or a node's
// certificate; job records, checkpoints and link probes a node's (a record
// only from the coordinator it names, a cut only from the coordinator of
// the record held here): 401 without a certificate, 403 with the wrong
// one. trust.May is the one table of who may do what; the actor port
// takes only node certificates (actors.Config.Authorize). Every request's Host must be an IP address, localhost, the node's
// name or a name of its certificate, and an Origin header its own (403).
// Without credentials every endpoint needs the local token
// (Config.TokenFile; 401 without it), and Start refuses to listen beyond
// loopback unless Config.Insecure. With Config.Files, a job's files must
// be inside that directory (job.Confine), at submission, at a takeover
// and on every stage's node.
//
// Each listening port (actor, data plane, link probe, HTTP) takes its
// connections through an admit gate of its own with Config.Conns's limits
// (gates.go); /metrics counts what each took and refused.
//
//	POST   /v1/jobs       body: job.Spec (fields left out take
//	                      job.DefaultSpec's values; an empty id gets a
//	                      unique one). The job is planned over the live
//	                      members before the answer: 201 {"id", "plan",
//	                      "status"}; 400 for a bad spec, bad partition or
//	                      more stages than nodes (nothing is started);
//	                      409 for an id in use. Training then runs in this
//	                      node and survives the client.
//	GET    /v1/jobs       [JobStatus] of the jobs this node coordinates
//	GET    /v1/jobs/{id}  JobStatus (job.Status with the coordinator,
//	                      holders and takeover); 404 if this node does not
//	                      coordinate it
//	DELETE /v1/jobs/{id}  cancels the job (it stops at its next step; its
//	                      record says failed, so it is not taken over): 202
//	GET    /v1/jobs/{id}/weights  the final weights of a job done here,
//	                      as safetensors (job.Job.WeightsMeta); 409 before it
//	                      is done; [Client.Weights] verifies and writes them
//	POST   /v1/jobs/{id}/replan  body: [ReplanRequest]. The job moves to
//	                      the partition at its next step boundary: 202
//	                      with its status; 400 for a partition that does
//	                      not fit the model or the members
//	GET    /v1/status     [Status]: the node, the members (with their HTTP
//	                      addresses), the jobs, the records held
//	GET    /              the dashboard, a page that draws /v1/status
//	                      (dashboard.go; its files under /web/), with the
//	                      access of the status
//	PUT    /v1/checkpoints/{job}         a replica of a cut (a tensorio
//	                      checkpoint file with its run in the metadata,
//	                      job.CutMeta; verified before it is kept): 204; 400
//	                      without a run; 403 for a job whose record this
//	                      node does not hold (or, with credentials, from a
//	                      node other than the coordinator it names); 409
//	                      for a cut of another run than the record's
//	GET    /v1/checkpoints/{job}         [CutList]: the steps of the cuts
//	                      kept and their run
//	GET    /v1/checkpoints/{job}/{step}  the cut's file as stored (the
//	                      reader verifies it)
//	PUT    /v1/jobrecords/{id}  a [JobRecord] from the job's coordinator:
//	                      204; 400 for a bad record, 409 for one older than
//	                      the record held, 403 from a node that is not a
//	                      member or, naming a new coordinator, not the
//	                      rightful successor
//	GET    /v1/jobrecords       the records this node holds
//	GET    /v1/jobrecords/{id}  the record held, or the one this node sent
//	                      as the job's coordinator; 404 otherwise
//	POST   /v1/links/probe  body: {"to": NODE}. Measures the link from
//	                      this node to a member (round-trip time and rate,
//	                      over the member's probe port, gossip tag "probe"):
//	                      200 [LinkProbeReply]; 400 for a node that is not
//	                      another live member. One probe at a time per
//	                      node; a coordinator keeps what it measured for
//	                      core.LinkMaxAge ([Agent.MeasureLink]).
//
// Floats that JSON cannot carry (a diverged job's NaN loss) are sent as 0.
//
// [Client] is the API's typed client; the CLI, the demo, the nodes
// themselves (records, cuts) and the integration tests use it.
//
// Request bodies are limited to 1 MiB (checkpoints to MaxCheckpointBytes).
//
// # Coordinator failover
//
// A job has Spec.Replicas copies (default 2): the coordinator's own
// store, and Replicas-1 holders, other live nodes with a store chosen
// deterministically (the current holders while they answer, then the
// others by name). A node has a store if it has a data dir
// (Config.DataDir; `ppnode join` gives every node one by default): a
// node without one holds no copies (so it never takes a job over), and
// the jobs it coordinates have no durable cuts (a successor restarts them
// from step 0). At submission, before the 201, the coordinator sends
// the holders the job's [JobRecord]: the normalised spec, the coordinator,
// the holders, the newest plan generation, the state. With every cut it
// writes its own copy, PUTs the cut to the holders, then the record (with
// the cut's generation, and the step and SHA-256 of its latest cuts,
// [JobRecord].Cuts); a node that is to become a holder first gets a record
// naming it, as a node takes cuts only of a job whose record it holds. The
// cut becomes the job's latest consistent cut
// (JobStatus.LatestCut) only once all of this is acknowledged. All of it
// runs in the background: the pipeline only waits if the previous cut is
// still being written when the next one is gathered. When the job ends
// the record says done (with the result) or failed (a diverged job too:
// its error says at which step), and is not taken over.
//
// A holder that sees the coordinator's node fail or leave (memberlist)
// computes the successor: the holder with the smallest name among the
// members it sees alive and not leaving. Every holder computes the same
// from the same record, so no message is needed to agree; a holder that
// fails later makes the others compute again. Only the successor acts: it
// takes the newest cut whose copy verifies (its own copies, then the other
// live holders', newest step first, its own first at equal steps; a
// damaged file is skipped for an older step or another copy; a fetched
// copy replaces the local one), or none (the job restarts from step 0),
// creates an actors.Coordinator with Resume, Takeover and a Generation of
// a new term (the high 32 bits of a generation count the takeovers, so the
// successor's plans are above anything its predecessor used, even after
// its last record), whose core starts with the same plan change as any
// other (a takeover from the cut), and runs it under the same job id, as
// if submitted there: the job is in its GET /v1/jobs with a [Takeover]. The new record
// goes to the new holders, to the former ones (who drop it if no longer
// holders) and to the former coordinator: one that was wrongly declared
// dead stops its run when it hears of the newer term (fencing), and its
// GET /v1/jobs/{id} then names the new coordinator (moved_to). A record
// older than the one held (lower term, or lower revision in the same term)
// is refused with 409. A record is taken only from a gossip member, and one
// that names a coordinator other than the record held only in a later
// term, once that coordinator is no longer a member (unless it is the
// receiving node, being fenced), and from the rightful successor: the one
// the rule above picks from the held record (rightful). The successor
// resumes only from a copy whose step and SHA-256 (of the cut stamped with
// the run, whichever copy it is) the record lists; any other copy, such as
// one planted in a store, is skipped with an error in the log.
//
// Job ids may be chosen by the user and reused, and the store outlives
// the node's process, so each run of a job (a submission; its takeovers
// continue it) has a nonce, [JobRecord].Run. The replicas carry it in
// their metadata (job.CutMeta; the coordinator's own copies are written by
// actors without it). Each node's store keeps the cuts of one run per job
// id: before a cut of run R is written there — the coordinator's at a
// fresh submission, a holder's when it keeps R's record or receives a cut
// of R, a successor's when it takes R over — the cuts of any other run of
// the id are removed (and those of a run from before the process started,
// which it cannot tell apart), so that an earlier run's higher steps can
// neither be resumed from nor make the store's keep-last-N prune R's cuts.
// A successor resumes only from cuts of its record's run: its own if its
// store is R's, another holder's if its [CutList] says R, and never a copy
// stamped with another run. A record of another run of an id replaces a
// record (or a job here) that ended, and is refused with 409 while that
// other run is in progress on the node.
//
// Deterministic replay makes the final weights those of a run without
// the fault. Limits: records are kept in memory only (a holder that
// restarts forgets them); a job whose coordinator and all holders die is
// lost; `ppnode train --via` finds the successor by asking every member it
// knows (GET /v1/jobs/{id}, then /v1/jobrecords/{id} for a job that ended
// meanwhile).
package nodes
