// Package balance decides which layers of a model run on which node and in
// what order: it profiles layers, partitions a model over unequal nodes
// (sequential pipelines and DAGs of stages), writes each stage's program
// for the GPipe, 1F1B, graph and zero-bubble schedules (with activation
// recomputation where a node's memory requires it), chooses schedule and
// micro-batch count by simulating plans event by event, and draws the
// result as a Gantt chart or a Chrome trace. It owns no sockets or clocks:
// only Profile and MeasureGEMMSpeeds measure, and Search solves its
// programmes on all CPUs.
//
// # Profiles and the cost model
//
// A ModelProfile has, per layer, forward and backward time on a reference
// node as Fixed + PerSample·b for micro-batches of b samples (Profile
// measures one size, ProfileWith two, Analytic estimates from FLOP counts),
// output, parameter and trainable bytes, the memory held per micro-batch
// in flight, and the optimizer-step time. Profile times the layers as
// training runs them, one micro-batch forward through every layer and
// back in reverse, repeated (a layer's weights are then as cold as in a
// stage), and keeps medians; under a CPU quota those are the speed between
// throttles, and so is the profile's reference, its GFLOPS
// (MeasureGEMMBurst). A node's time is the reference time divided by its
// Speed (given, or its GEMM GFLOP/s over the reference's; nodes measure
// theirs over whole quota periods, MeasureGEMMSpeeds). A transfer of n bytes (the tensorio frame of the
// activation or gradient) occupies the link for n/bandwidth and arrives a
// latency later; with a link's WireCost for its kind (what its codec did),
// for n·(encode and decode seconds per byte) + n·ratio/bandwidth. The
// Feeder's links carry each micro-batch's inputs to the stages that read
// them, from the step's start (the planner charges them at the first cut;
// it does not prefer the feeder's node for the first stage). A stage's memory is its parameters and buffers, one
// gradient and the optimizer's state per trainable parameter, and per
// micro-batch in flight its layers' buffers and its received inputs;
// GPipe keeps M micro-batches in flight, 1F1B min(M, S-k) on stage k, zb
// min(M, S). A stage that recomputes its activations keeps one
// micro-batch's buffers and the inputs of those in flight.
//
// # Partition descriptions
//
// A partition is written as stages separated by ';'. A stage is one or
// more ranges joined by '+', then optionally '@' and its node, or nodes
// separated by ',' (replicas, see below), each optionally with its share
// of the micro-batches after ':':
//
//	fc1-fc8@a; fc9-fc20@b; fc21-fc32@c
//	flatten + tower1.slice-tower1.fc3@a; tower2.slice-tower2.fc3@b; tower3.slice-tower3.fc3@c; concat-out@d
//	fc1-fc16@a,b; fc17-fc32@c
//	fc1-fc16@a:3,b:1; fc17-fc32@c
//
// A range "first-last" covers the layers from first to last in the model's
// topological order (graph.Nodes). A layer is attached to the layer before
// it when it has no parameters, reads only that layer's output and is its
// only reader (ReLU after Linear, pooling or dropout after ReLU); a range
// also takes the chain of layers attached after its last layer, up to the
// first one that the description names as the first or last layer of a
// range. So "fc1-fc8" is fc1 ... fc8 and relu8 in mlp32, and
// "fc1-fc8; relu8-fc32" puts relu8 in the second stage. Stages without a
// node take, in order, the nodes that no stage names. The stage graph of
// a DAG model (which stage feeds which) follows from the layers: ranges of
// different branches in different stages make stages that run at the same
// time. Validation names the layer, node or stage at fault when a layer is
// in no stage or in two, a name is unknown, a node holds two stages (as
// node or replica), a stage is empty, the stages depend on each other in a
// cycle, or a tensor's gradients could not be summed in single-process
// order (see StageOutput). Shares are all given or none (the equal split,
// earlier nodes taking the remainder); FormatSpec writes them only when
// the partition gives them, and Build refuses shares that do not add up
// to the plan's micro-batch count.
//
// # Replicated stages
//
// A stage with replicas runs on several nodes, each an executor of its
// own in the plan (StagePlan: Group is the stage, Replica the index),
// with the same layers, on its share of the micro-batches. Its program is
// the stage's program restricted to those micro-batches, so any run of
// the plan without replicas orders the replicas' instructions too: they
// cannot deadlock where it does not. Activations and gradients go to the
// executor that runs the micro-batch in the next or previous stage.
// Before the optimizer step the replicas sum their parameter gradients in
// a chain, so that they keep identical weights: replica r > 0 receives the
// sum of replicas 0..r-1 (OpRecvSum), replica r < R-1 sends its running
// sum to r+1 (OpSendSum), and the last replica sends the total to every
// other.
//
// One process adds every micro-batch's parameter gradient, in ascending
// order, inside the GEMM's chain of additions (dW += dyᵀ·x with beta = 1):
// the sum over micro-batches 0..m is not a sum of per-replica totals, and
// only a replica that continues from the sum of all micro-batches before
// its own computes the same bits. With Plan.ChainedSums (deterministic
// jobs) replica r therefore runs the r-th block of consecutive
// micro-batches, receives the sum of the blocks before (the prefix)
// before its first backward pass, and its backward passes add onto it:
// the replicas' backward passes run one replica after the other, while
// their forward passes, and the stages around them, still overlap.
// Without it the micro-batches are interleaved by share (each next one to
// the replica furthest behind its share), so that replicas fed by one
// executor, micro-batch after micro-batch, work at the same time (with
// blocks, the second replica would wait for the first's share to pass
// by); a replica receives the prefix after its last backward pass and
// adds its own sum to it, ((g0 + g1) + g2) ..., which every replica then
// holds: the same weights on every replica, rounded differently from one
// process. Buffers that a forward pass updates (BatchNorm's running
// statistics) are not summed: each replica sees only its micro-batches.
//
// Copies of a tied tensor (nn.Ties) on several stages exchange their
// gradients after those sums, right before the step: replica 0 of each
// holding stage sends its copies' gradients to every executor of the
// other holding stages (OpSendTie), every executor receives them
// (OpRecvTie) and adds all copies in node order at OpStep, as one
// process does.
//
// # Partitioners
//
// Units are a layer and the layers attached after it; partitioners cut
// only between units. U is the number of units, N of nodes.
//
//   - uniform: U/N consecutive units per node, nodes in the order given.
//     O(U). Guarantees equal layer counts (±1), nothing about time.
//   - params: consecutive units per node in the order given, minimising
//     the largest stage's parameter bytes (DeepSpeed's default). Exact
//     min-max, O(U² N).
//   - balanced (BaPipe): nodes in canonical order, fastest first (ties: more
//     memory); a pipeline of S stages uses the S fastest, slowest stage
//     first. A dynamic programme over (first unit, nodes left) finds for
//     every S the least bottleneck T*(S) = max over stages of compute
//     time and input-link time, subject to every node's memory under the
//     schedule's micro-batches in flight; a second pass finds, among the
//     partitions within T*(S), the one with the least critical path (one
//     micro-batch's forward and backward through all stages and links).
//     Both are exact for this cost model (tested against brute force);
//     transfers of a DAG model are charged at every cut a tensor crosses.
//     O(U² N) per pass in the worst case; the loops stop at the first
//     stage slower than the best found, which makes balanced instances
//     near O(U² log N). The node count S is chosen by simulated step time:
//     of the counts whose T*(S) improves on every smaller count, the four
//     with the least estimated step time (M-1)·T + CP are simulated.
//   - graph (GraphPipe): the balanced programme with a second kind of step
//     at fork-join regions (the parts between two cuts that one tensor
//     crosses, such as uno's towers or a ResNet block with a downsample
//     branch): the branches go to G >= 2 nodes at once (all branch-to-node
//     assignments up to 4096, else longest branch first), optionally with
//     the chain before the fork on the first of them, and run concurrently.
//     It tries each bottleneck bound T*(S) on every node count and keeps
//     the plans with the least estimated step time (M-1)·T + CP; the
//     simulator picks among them. On a model with no fork-join region it is
//     the balanced partitioner. O(U² N²) plus the assignments.
//   - replicas (Options.Replicas, with balanced or graph): a chain stage
//     may also run on a run of k consecutive nodes of the canonical order
//     (k <= M) as its replicas, each taking a share of the micro-batches:
//     one each, then each next one to the replica that would finish it
//     soonest, which minimises the slowest replica's time max_r
//     n_r/speed_r (tested against every split). A stage [i, e) on such a
//     run costs per step that slowest share of its work plus the gradient
//     sum (the chain and the total's return, over the run's links); with
//     chained sums the backward passes count once per replica, as they run
//     one after the other. The input link term charges each replica its
//     share of the cut's transfers; memory is checked on every node of the
//     run, with the sum it receives. Both passes of the programme take a
//     run size besides the stage's end, O(U² N²) in the worst case for the
//     first pass; in the second, the stage's best end is a window minimum
//     of one array per (nodes left, run size), O(U N²) per bound where
//     memory does not bind (else the ends that fit are scanned). The
//     node counts are tried in order of a lower bound of their estimate,
//     the least critical path without a bound. The plans with and
//     without replicas are simulated side by side, so a search with
//     replicas never returns a slower plan than one without. (The link and
//     sum terms take each coefficient's largest value over the run's
//     nodes, an upper bound that keeps a run's price O(1).)
//
// Replicas are runs of consecutive nodes in speed order, not arbitrary sets
// of nodes: that keeps the programme polynomial (the number of ways to
// split N nodes into sets grows faster than exponentially), and replicas of
// similar speed lose the least to integer shares, since a fast replica next
// to a slow one waits for the slow one's whole micro-batches. DTFM searches
// arbitrary groups of nodes by an evolutionary search, without a bound on
// how far it lands from the optimum; PipeDream's programme is exact over
// replication counts but assumes identical workers; this one is exact (tested
// against brute force) for unequal nodes within the consecutive-run rule.
//
// # Schedules and programs
//
// A Plan lists per stage an explicit program (Instr): receive activations,
// forward m, (loss m), send activations, receive gradients, backward m,
// send gradients, and finally the optimizer step. Sends do not wait;
// receives do. GPipe runs every forward, then every backward; 1F1B (stages
// forming a chain) warms up with S-k-1 forwards, then alternates; the graph
// schedule is 1F1B on a DAG of stages, warming up with d-1 forwards where
// d is the stage's longest path to the end. With replicas d counts nodes,
// the stage's own included, not stages: a stage runs ahead by as many
// micro-batches as the replicas after it run at once, and a replica runs
// the stage's program restricted to its micro-batches. In every schedule each stage runs its backward
// passes in ascending micro-batch order, which with the gradient order of
// StageOutput (and, for replicas, the chained sums) makes pipelined
// training bit-identical to single-process training. A recomputing stage
// runs `recompute m` (the forward pass again) before each backward pass;
// zb splits each backward pass into `backward_input m` and `weight m`,
// stage k's weight passes lagging k micro-batches, in ascending order.
// Interleaved 1F1B runs P×v stages on P nodes, node i holding stages i,
// i+P, ... (Partition.Chunks): each stage's program is its share of its
// node's passes in Megatron-LM's order (InterleavedOrder), and the node
// runs them as one executor in that order (Plan.NodeOrder), which the
// simulator replays and the runtime enforces.
//
// # Simulator
//
// Simulate replays a plan's programs in time order: compute takes the
// profiled time scaled by the node's speed, each link direction carries
// one transfer at a time in the order sent; a gradient sum carries the
// stage's trainable parameters as gradients. It reports step time, bubble
// and busy fractions, peak memory per executor (a replica holds all of its
// stage's parameters, gradients and optimizer state, the sum it receives,
// and its own micro-batches in flight) and link use, and its events draw
// the Gantt chart (WriteSVG) and the Chrome trace (WriteTrace).
// Search runs a partitioner for each schedule and micro-batch count (the
// programmes in parallel, and GPipe's and 1F1B's once when memory binds on
// no node: they are then the same problem), simulates the candidates and
// keeps the fastest plan that fits memory. With replicas it plans 64 nodes
// of mixed speeds and links in well under a second (BenchmarkSearchReplicas).
package balance
