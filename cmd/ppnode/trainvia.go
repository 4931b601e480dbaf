package main

import (
	"flag"
	"io"

	"github.com/ppnode/ppnode/actors"
)

// clusterFlags are the options of a job submitted to a cluster.
type clusterFlags struct {
	via       string
	partition string
	schedule  string
	maxNodes  int
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.via, "via", "", "submit the job through the node whose HTTP address this is (host:port)")
	fs.StringVar(&c.partition, "partition", "auto", `partition: auto, uniform, params, balanced, graph, or a description such as "fc1-fc16@a; fc17-fc32@b"`)
	fs.StringVar(&c.schedule, "schedule", "auto", "pipeline schedule: auto, gpipe, 1f1b or graph")
	fs.IntVar(&c.maxNodes, "max-nodes", 0, "use at most this many nodes (0: as many as help)")
}

func trainVia(spec actors.JobSpec, f *trainFlags, c *clusterFlags, stdout, stderr io.Writer) error {
	return usagef("give --local, or --via host:port of a node")
}
