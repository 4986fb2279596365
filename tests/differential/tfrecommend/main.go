// tfrecommend runs TensorFusion's own percentile recommender (internal/autoscaler/recommender, built from
// its module at the commit this project checks compatibility against) on sample streams read as JSON from
// stdin, and prints what it recommends after every tick as JSON on stdout. generate.sh drops this file into
// a copy of TensorFusion's module as cmd/tfrecommend, since an internal package can only be imported from
// inside its own module.
//
// `tfrecommend cron` reads the cron cases instead: robfig/cron v3 (the version TensorFusion's go.mod pins)
// with the parser options of TensorFusion's cron_recommender.go, and TensorFusion's own CronRecommender run
// at chosen instants (generate.sh gives it a settable clock). Rules without CRON_TZ= run in UTC here
// (time.Local is set to UTC), as the project's default --autoscale-cron-time-zone.
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
	"github.com/robfig/cron/v3"
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
	Message        string           `json:"message"`
}

type caseOut struct {
	Name  string    `json:"name"`
	Ticks []tickOut `json:"ticks"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "cron" {
		time.Local = time.UTC
		runCron()
		return
	}
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
			o.Message = cond.Message
		}
		result.Ticks = append(result.Ticks, o)
	}
	return result
}

// -- cron -------------------------------------------------------------------------------------------------

type nextIn struct {
	Expr   string `json:"expr"`
	Zone   string `json:"zone"`
	UnixNs int64  `json:"unix_ns"`
}

type cronTick struct {
	UnixNs int64 `json:"unix_ns"`
}

type cronCaseIn struct {
	Name      string                 `json:"name"`
	Resources map[string]string      `json:"resources"`
	Rules     []tfv1.CronScalingRule `json:"rules"`
	Ticks     []cronTick             `json:"ticks"`
}

type cronIn struct {
	Parse []string     `json:"parse"`
	Next  []nextIn     `json:"next"`
	Cases []cronCaseIn `json:"cases"`
}

type cronTickOut struct {
	Recommendation map[string]int64 `json:"recommendation"`
	Reason         string           `json:"reason"`
	Message        string           `json:"message"`
	Active         string           `json:"active"`
	Error          bool             `json:"error"`
}

type cronOut struct {
	Parse []bool     `json:"parse"`
	Next  []*int64   `json:"next"`
	Cases []caseCron `json:"cases"`
}

type caseCron struct {
	Name  string        `json:"name"`
	Ticks []cronTickOut `json:"ticks"`
}

func runCron() {
	var in cronIn
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "tfrecommend cron: reading cases:", err)
		os.Exit(2)
	}
	// the options of NewCronRecommender in internal/autoscaler/recommender/cron_recommender.go
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	out := cronOut{}
	for _, expr := range in.Parse {
		out.Parse = append(out.Parse, acceptedByTensorFusion(expr))
	}
	for _, n := range in.Next {
		loc, err := time.LoadLocation(n.Zone)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tfrecommend cron:", err)
			os.Exit(2)
		}
		sched, err := parser.Parse(n.Expr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tfrecommend cron: next of a refused expression", n.Expr, err)
			os.Exit(2)
		}
		next := sched.Next(time.Unix(0, n.UnixNs).In(loc))
		if next.IsZero() {
			out.Next = append(out.Next, nil)
			continue
		}
		unix := next.Unix()
		out.Next = append(out.Next, &unix)
	}
	for _, c := range in.Cases {
		out.Cases = append(out.Cases, runCronCase(c))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "tfrecommend cron: writing results:", err)
		os.Exit(2)
	}
}

// acceptedByTensorFusion runs the expression through TensorFusion's own CronRecommender as a rule's start:
// it fails only when the parser refuses the expression.
func acceptedByTensorFusion(expr string) bool {
	state := workload.NewWorkloadState()
	state.Namespace, state.Name = "default", "parse"
	state.Spec.AutoScalingConfig.CronScalingRules = []tfv1.CronScalingRule{
		{Enable: true, Name: "r", Start: expr, End: "0 0 1 1 *"},
	}
	_, err := recommender.NewCronRecommender(nil).Recommend(context.Background(), state)
	return err == nil || expr == "0 0 1 1 *"
}

func runCronCase(c cronCaseIn) caseCron {
	ctx := context.Background()
	state := workload.NewWorkloadState()
	state.Namespace, state.Name = "default", c.Name
	state.Spec.Resources = tfv1.Resources{
		Requests: tfv1.Resource{Tflops: resource.MustParse(c.Resources["requests.tflops"]),
			Vram: resource.MustParse(c.Resources["requests.vram"])},
		Limits: tfv1.Resource{Tflops: resource.MustParse(c.Resources["limits.tflops"]),
			Vram: resource.MustParse(c.Resources["limits.vram"])},
	}
	state.Spec.AutoScalingConfig.CronScalingRules = c.Rules
	recommenders := []recommender.Interface{recommender.NewCronRecommender(nil)}
	result := caseCron{Name: c.Name}
	for _, t := range c.Ticks {
		now := time.Unix(0, t.UnixNs).UTC()
		recommender.GoldenNow = func() time.Time { return now }
		state.Status.Conditions = nil
		o := cronTickOut{}
		rec, err := recommender.GetRecommendation(ctx, state, recommenders)
		if err != nil {
			o.Error = true
		} else if rec != nil {
			state.SetRecommendation(rec)
			o.Recommendation = map[string]int64{
				"requests.tflops": rec.Requests.Tflops.MilliValue(), "requests.vram": rec.Requests.Vram.MilliValue(),
				"limits.tflops": rec.Limits.Tflops.MilliValue(), "limits.vram": rec.Limits.Vram.MilliValue(),
			}
		}
		// UpdateWorkloadStatus (internal/autoscaler/workload/handler.go) shows the cron recommender's
		// RecommendationProvided condition as ResourceUpdate
		for _, kind := range []string{constants.ConditionStatusTypeResourceUpdate,
			constants.ConditionStatusTypeRecommendationProvided} {
			if cond := meta.FindStatusCondition(state.Status.Conditions, kind); cond != nil {
				o.Reason = cond.Reason
			o.Message = cond.Message
				break
			}
		}
		if rule := state.ActiveCronScalingRuleSnapshot(); rule != nil {
			o.Active = rule.Name
		}
		result.Ticks = append(result.Ticks, o)
	}
	return result
}
