// tftopo runs TensorFusion's own GPU topology evaluators (internal/scheduler/gputopo, built from its module
// at the commit this project checks compatibility against) on the cases read as JSON from stdin, and prints
// the GPUs and tier each case gets as JSON on stdout. generate-topology.sh drops this file into a copy of
// TensorFusion's module as cmd/tftopo, since an internal package can only be imported from inside its module.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	tfv1 "github.com/NexusGPU/tensor-fusion/api/v1"
	gputopo "github.com/NexusGPU/tensor-fusion/internal/scheduler/gputopo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type peerIn struct {
	UUID      string `json:"uuid"`
	Tier      int32  `json:"tier"`
	Bandwidth int64  `json:"bandwidth"`
}

type gpuIn struct {
	Name  string   `json:"name"`
	UUID  string   `json:"uuid"`
	NUMA  *int32   `json:"numa"`
	Peers []peerIn `json:"peers"`
	Score *int     `json:"score"`
}

type caseIn struct {
	Name              string  `json:"name"`
	Source            string  `json:"source"`
	MaxAllowedTier    int     `json:"max_allowed_tier"`
	Count             uint    `json:"count"`
	PreferLeastDamage bool    `json:"prefer_least_damage"`
	Scored            bool    `json:"scored"`
	GPUs              []gpuIn `json:"gpus"`
}

type answer struct {
	GPUs []string `json:"gpus"`
	Tier int      `json:"tier"`
}

// caseOut lists every answer TensorFusion gave in repeated runs: where NUMA nodes tie, it ranges over a Go
// map, so its pick among equally good NUMA nodes varies from run to run.
type caseOut struct {
	Name    string   `json:"name"`
	Answers []answer `json:"answers"`
}

const runs = 40

func evaluator(source string, maxTier int) gputopo.Evaluator {
	switch source {
	case gputopo.TopologySourceNUMA:
		return gputopo.NewNUMAEvaluator(maxTier)
	case gputopo.TopologySourceVendor:
		return gputopo.NewPeerTopologyEvaluator(maxTier)
	default:
		return gputopo.NewAutoEvaluator(maxTier)
	}
}

func main() {
	var cases []caseIn
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := make([]caseOut, 0, len(cases))
	for _, c := range cases {
		gpus := make([]*tfv1.GPU, 0, len(c.GPUs))
		scores := map[string]int{}
		for _, g := range c.GPUs {
			gpu := &tfv1.GPU{ObjectMeta: metav1.ObjectMeta{Name: g.Name}}
			gpu.Status.UUID = g.UUID
			gpu.Status.NUMANode = g.NUMA
			if len(g.Peers) > 0 {
				topo := &tfv1.GPUTopologyStatus{}
				for _, p := range g.Peers {
					topo.Peers = append(topo.Peers, tfv1.GPUPeerLinkStatus{PeerGPUUUID: p.UUID, Tier: p.Tier, Bandwidth: p.Bandwidth})
				}
				gpu.Status.Topology = topo
			}
			if g.Score != nil {
				scores[g.Name] = *g.Score
			}
			gpus = append(gpus, gpu)
		}
		var scorer gputopo.GPUScorer
		if c.Scored {
			scorer = func(gpu *tfv1.GPU) int { return scores[gpu.Name] }
		}
		seen := map[string]bool{}
		result := caseOut{Name: c.Name, Answers: []answer{}}
		for run := 0; run < runs; run++ {
			plan, err := evaluator(c.Source, c.MaxAllowedTier).EvaluateWithScorer(gpus, c.Count, c.PreferLeastDamage, scorer)
			if err != nil {
				fmt.Fprintln(os.Stderr, c.Name, err)
				os.Exit(1)
			}
			ids := plan.BestGPUIds
			if ids == nil {
				ids = []string{}
			}
			key := fmt.Sprint(ids, plan.Tier)
			if !seen[key] {
				seen[key] = true
				result.Answers = append(result.Answers, answer{GPUs: ids, Tier: int(plan.Tier)})
			}
		}
		out = append(out, result)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
