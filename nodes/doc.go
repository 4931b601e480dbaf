// Package nodes is one machine's agent (DESIGN.md, "Layout"): it measures
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
// the HTTP address (tag "http"). A member that memberlist reports failed or
// gone has its actor endpoint terminated, so that actors watching PIDs
// there receive Terminated (protoactor's remote has no keepalive).
//
// Leave and Close stop, in order: new submissions, the jobs this node
// coordinates (a job notices at its next step), the HTTP server, the
// membership, and the actor system; they return once every goroutine and
// listener of the agent is gone.
//
// # HTTP API
//
// All bodies are JSON. Errors are {"error": "..."} with a 4xx or 5xx code.
//
//	POST   /v1/jobs       body: actors.JobSpec (fields left out take
//	                      actors.DefaultSpec's values; an empty id gets a
//	                      unique one). The job is planned over the live
//	                      members before the answer: 201 {"id", "plan",
//	                      "status"}; 400 for a bad spec, bad partition or
//	                      more stages than nodes (nothing is started);
//	                      409 for an id in use. Training then runs in this
//	                      node and survives the client.
//	GET    /v1/jobs       [actors.JobStatus] of the jobs this node coordinates
//	GET    /v1/jobs/{id}  actors.JobStatus; 404 if unknown
//	DELETE /v1/jobs/{id}  cancels the job (it stops at its next step): 202
//	GET    /v1/status     [Status]: the node, the members, the jobs
//
// Floats that JSON cannot carry (a diverged job's NaN loss) are sent as 0.
//
// Request bodies are limited to 1 MiB.
package nodes
