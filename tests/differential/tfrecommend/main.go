// tfrecommend runs TensorFusion's own percentile recommender (internal/autoscaler/recommender, built from
// its module at the commit this project checks compatibility against) on sample streams read as JSON from
// stdin, and prints what it recommends after every tick as JSON on stdout. build-tfrecommend.sh drops this
// file into a copy of TensorFusion's module as cmd/tfrecommend, since an internal package can only be
// imported from inside its own module.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	tfv1 "github.com/NexusGPU/tensor-fusion/api/v1"
	"github.com/NexusGPU/tensor-fusion/internal/autoscaler/metrics"
	"github.com/NexusGPU/tensor-fusion/internal/autoscaler/recommender"
	"github.com/NexusGPU/tensor-fusion/internal/autoscaler/workload"
	"github.com/NexusGPU/tensor-fusion/pkg/constants"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type sample struct {
	Worker string  `json:"worker"`
	Tflops float64 `json:"tflops"`
	Vram   uint64  `json:"vram"`
	UnixNs int64   `json:"unix_ns"`
}

type tick struct {
	Samples []sample `json:"samples"`
}

type caseIn struct {
	Name             string                 `json:"name"`
	Qos              string                 `json:"qos"`
	CreationAgeNs    int64                  `json:"creation_age_ns"`
	HistoryPeriod    string                 `json:"history_period"`
	Resources        map[string]string      `json:"resources"`
	AutoSetResources *tfv1.AutoSetResources `json:"auto_set_resources"`
	Ticks            []tick                 `json:"ticks"`
}

type tickOut struct {
	Recommendation map[string]int64 `json:"recommendation"`
	Reason         string           `json:"reason"`
}

type caseOut struct {
	Name  string    `json:"name"`
	Ticks []tickOut `json:"ticks"`
}

func main() {
	var cases []caseIn
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintln(os.Stderr, "tfrecommend: reading cases:", err)
		os.Exit(2)
	}
	out := make([]caseOut, 0, len(cases))
	for _, c := range cases {
		out = append(out, run(c))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "tfrecommend: writing results:", err)
		os.Exit(2)
	}
}

func run(c caseIn) caseOut {
	ctx := context.Background()
	state := workload.NewWorkloadState()
	state.Namespace, state.Name = "default", c.Name
	state.Spec.Qos = tfv1.QoSLevel(c.Qos)
	state.Spec.Resources = tfv1.Resources{
		Requests: tfv1.Resource{Tflops: resource.MustParse(c.Resources["requests.tflops"]),
			Vram: resource.MustParse(c.Resources["requests.vram"])},
		Limits: tfv1.Resource{Tflops: resource.MustParse(c.Resources["limits.tflops"]),
			Vram: resource.MustParse(c.Resources["limits.vram"])},
	}
	state.Spec.AutoScalingConfig.AutoSetResources = c.AutoSetResources
	state.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Duration(c.CreationAgeNs)))
	if period, err := time.ParseDuration(c.HistoryPeriod); c.HistoryPeriod != "" && err == nil {
		// what the workload handler does with spec.autoScalingConfig.autoSetResources.historyDataPeriod
		state.HistoryPeriod = period
		state.WorkerUsageAggregator = metrics.NewWorkerUsageAggregator(period / 2)
	}
	recommenders := []recommender.Interface{recommender.NewPercentileRecommender(nil)}
	result := caseOut{Name: c.Name}
	for _, t := range c.Ticks {
		for _, s := range t.Samples {
			state.AddSample(&metrics.WorkerUsage{Namespace: "default", WorkloadName: c.Name, WorkerName: s.Worker,
				TflopsUsage: s.Tflops, VramUsage: s.Vram, Timestamp: time.Unix(0, s.UnixNs)})
		}
		state.Status.Conditions = nil
		rec, err := recommender.GetRecommendation(ctx, state, recommenders)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tfrecommend:", c.Name, err)
			os.Exit(1)
		}
		o := tickOut{}
		if rec != nil {
			state.SetRecommendation(rec)
			o.Recommendation = map[string]int64{
				"requests.tflops": rec.Requests.Tflops.MilliValue(), "requests.vram": rec.Requests.Vram.MilliValue(),
				"limits.tflops": rec.Limits.Tflops.MilliValue(), "limits.vram": rec.Limits.Vram.MilliValue(),
			}
		}
		if cond := meta.FindStatusCondition(state.Status.Conditions, constants.ConditionStatusTypeResourceUpdate); cond != nil {
			o.Reason = cond.Reason
		}
		result.Ticks = append(result.Ticks, o)
	}
	return result
}
