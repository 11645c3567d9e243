package calibrate

import (
	"math"
	"strings"
	"testing"
)

// group16 returns 16 rewards: 1.0 at the given indices, fill elsewhere.
func group16(fill float64, successAt ...int) []float64 {
	g := make([]float64, 16)
	for i := range g {
		g[i] = fill
	}
	for _, i := range successAt {
		g[i] = 1
	}
	return g
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPassAtKHandComputed(t *testing.T) {
	// Seed 0 first succeeds at rollout 0, seed 1 at rollout 5, seed 2 at
	// rollout 12, seed 3 never. Counting by hand over the first k rollouts:
	// pass@1 = 1/4, pass@4 = 1/4, pass@8 = 2/4 (seeds 0, 1), pass@16 = 3/4.
	rewards := [][]float64{
		group16(0, 0, 3, 9),
		group16(0.5, 5),
		group16(0.2, 12, 15),
		group16(0.3),
	}
	s, err := SummarizeRewards(rewards, DefaultBands())
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]float64{1: 0.25, 4: 0.25, 8: 0.5, 16: 0.75}
	if len(s.PassAt) != 4 {
		t.Fatalf("pass@k = %v, want 4 entries", s.PassAt)
	}
	for k, w := range want {
		got, ok := s.PassAtK(k)
		if !ok || !near(got, w) {
			t.Errorf("pass@%d = %v (computed %v), want %v", k, got, ok, w)
		}
	}
	// Successes: 3 + 1 + 2 + 0 = 6 of 64.
	if !near(s.SuccessRate, 6.0/64) {
		t.Errorf("success rate = %v, want 6/64", s.SuccessRate)
	}
	// Sum: 3 + (15*0.5+1) + (14*0.2+2) + 16*0.3 = 3 + 8.5 + 4.8 + 4.8 = 21.1.
	if !near(s.Mean, 21.1/64) {
		t.Errorf("mean = %v, want 21.1/64", s.Mean)
	}
}

func TestPassAtKOnlyUpToGroupSize(t *testing.T) {
	s, err := SummarizeRewards([][]float64{{0, 1, 0, 0, 0}, {0, 0, 0, 0, 1, 0}}, DefaultBands())
	if err != nil {
		t.Fatal(err)
	}
	// The smallest group has 5 rollouts: pass@1 and pass@4 only.
	if len(s.PassAt) != 2 || s.PassAt[0] != (PassAt{1, 0}) || s.PassAt[1] != (PassAt{4, 0.5}) {
		t.Errorf("pass@k = %v, want [{1 0} {4 0.5}]", s.PassAt)
	}
	if _, ok := s.PassAtK(8); ok {
		t.Error("pass@8 reported for groups of 5 and 6 rollouts")
	}
}

func TestSummaryFigures(t *testing.T) {
	tests := []struct {
		name    string
		rewards [][]float64
		mean    float64
		success float64
		std     float64
		allSucc float64
		allZero float64
		consta  float64
		hist    [HistogramBins]int
	}{
		{
			name:    "two constant groups",
			rewards: [][]float64{{1, 1}, {0, 0}},
			mean:    0.5, success: 0.5, std: 0.5,
			allSucc: 0.5, allZero: 0.5, consta: 1,
			hist: [HistogramBins]int{0: 2, 9: 2},
		},
		{
			name:    "partial credit",
			rewards: [][]float64{{0.25, 0.75}, {0.5, 0.5}},
			mean:    0.5, success: 0, std: math.Sqrt((0.0625 + 0.0625) / 4),
			allSucc: 0, allZero: 0, consta: 0.5,
			hist: [HistogramBins]int{2: 1, 5: 2, 7: 1},
		},
		{
			name:    "bin edges",
			rewards: [][]float64{{0, 0.1, 0.9, 0.99, 1}},
			mean:    2.99 / 5, success: 0.2,
			std:     math.Sqrt(((0-0.598)*(0-0.598) + (0.1-0.598)*(0.1-0.598) + (0.9-0.598)*(0.9-0.598) + (0.99-0.598)*(0.99-0.598) + (1-0.598)*(1-0.598)) / 5),
			allSucc: 0, allZero: 0, consta: 0,
			hist: [HistogramBins]int{0: 1, 1: 1, 9: 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := SummarizeRewards(tt.rewards, DefaultBands())
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"mean", s.Mean, tt.mean}, {"success", s.SuccessRate, tt.success}, {"std", s.Std, tt.std},
				{"all-success", s.AllSuccess, tt.allSucc}, {"all-zero", s.AllZero, tt.allZero},
				{"constant", s.Constant, tt.consta}, {"informative", s.Informative, 1 - tt.consta},
			} {
				if !near(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
			if s.Histogram != tt.hist {
				t.Errorf("histogram = %v, want %v", s.Histogram, tt.hist)
			}
		})
	}
}

func TestHintedSuccessRates(t *testing.T) {
	s, err := Summarize([]Group{
		{Seed: 7, Rewards: []float64{1, 0, 1, 0.5}, Hinted: []bool{true, true, false, false}},
	}, DefaultBands())
	if err != nil {
		t.Fatal(err)
	}
	if s.HintedRollouts != 2 || !near(s.HintedSuccessRate, 0.5) || !near(s.UnhintedSuccessRate, 0.5) {
		t.Errorf("hinted %d at %v, unhinted %v; want 2 at 0.5, 0.5", s.HintedRollouts, s.HintedSuccessRate, s.UnhintedSuccessRate)
	}
}

func TestVerdicts(t *testing.T) {
	// mixed16 gives a group with n successes and partial credit p elsewhere.
	mixed := func(n int, p float64) []float64 {
		g := group16(p)
		for i := 0; i < n; i++ {
			g[i*16/max(n, 1)] = 1
		}
		return g
	}
	repeat := func(g []float64, n int) [][]float64 {
		out := make([][]float64, n)
		for i := range out {
			out[i] = g
		}
		return out
	}
	tests := []struct {
		name      string
		rewards   [][]float64
		verdict   string
		failed    []string
		diagnosis string
	}{
		{"in band", repeat(mixed(6, 0.3), 10), Accepted, nil, "accepted"},
		{"oracle", repeat(group16(1), 10), TooEasy,
			[]string{"mean_max", "success_max", "max_all_success", "min_std", "max_constant", "min_informative"},
			"more constraints or steps, fewer hints"},
		{"mostly solved", repeat(mixed(14, 0.5), 10), TooEasy, []string{"mean_max", "success_max"}, "too easy (mean reward"},
		{"nothing works", repeat(group16(0), 10), TooHard,
			[]string{"mean_min", "success_min", "max_all_zero", "min_std", "max_constant", "min_informative"},
			"simpler instances, more hints"},
		{"rarely solved", repeat(mixed(1, 0.1), 10), TooHard, []string{"mean_min", "success_min"}, "too hard (mean reward"},
		{"half always, half never", append(repeat(group16(1), 5), repeat(group16(0), 5)...), Bimodal,
			[]string{"max_all_success", "max_all_zero", "max_constant", "min_informative"}, "more uniform"},
		{"constant within seeds", append(repeat([]float64{0.4, 0.4, 1, 1}, 6), repeat([]float64{0.4, 0.4, 0.4, 0.4}, 4)...), Accepted, nil, ""},
		{"constant groups", append(repeat(group16(0.4), 6), repeat(mixed(8, 0.2), 4)...), Uninformative,
			[]string{"max_constant", "min_informative"}, "multi-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := SummarizeRewards(tt.rewards, DefaultBands())
			if err != nil {
				t.Fatal(err)
			}
			var failed []string
			for _, f := range s.Failures {
				failed = append(failed, f.Band)
			}
			if s.Verdict != tt.verdict || strings.Join(failed, ",") != strings.Join(tt.failed, ",") {
				t.Fatalf("verdict %s, failed %v; want %s, %v (%s)", s.Verdict, failed, tt.verdict, tt.failed, s)
			}
			if s.Accepted != (tt.verdict == Accepted) {
				t.Errorf("accepted = %v with verdict %s", s.Accepted, s.Verdict)
			}
			if !strings.Contains(s.Diagnosis, tt.diagnosis) {
				t.Errorf("diagnosis %q does not contain %q", s.Diagnosis, tt.diagnosis)
			}
		})
	}
}

func TestSummarizeRejects(t *testing.T) {
	bad := DefaultBands()
	bad.MeanMin = 0.7
	tests := []struct {
		name   string
		groups []Group
		bands  Bands
		want   string
	}{
		{"no groups", nil, DefaultBands(), "no groups"},
		{"empty group", []Group{{Seed: 3}}, DefaultBands(), "seed 3 has no rollouts"},
		{"reward above 1", []Group{{Seed: 4, Rewards: []float64{0.5, 1.5}}}, DefaultBands(), "seed 4 rollout 1: reward 1.5"},
		{"NaN reward", []Group{{Seed: 5, Rewards: []float64{math.NaN()}}}, DefaultBands(), "seed 5 rollout 0"},
		{"hint flags", []Group{{Seed: 6, Rewards: []float64{1}, Hinted: []bool{true, false}}}, DefaultBands(), "2 hinted flags for 1 rewards"},
		{"bad bands", []Group{{Rewards: []float64{1}}}, bad, "mean_min = 0.7 is above mean_max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Summarize(tt.groups, tt.bands)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestBandsValidate(t *testing.T) {
	if err := DefaultBands().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		field string
		set   func(*Bands)
	}{
		{"mean_min", func(b *Bands) { b.MeanMin = -0.1 }},
		{"mean_max", func(b *Bands) { b.MeanMax = 1.2 }},
		{"success_min", func(b *Bands) { b.SuccessMin = 0.9 }},
		{"success_max", func(b *Bands) { b.SuccessMax = math.NaN() }},
		{"min_std", func(b *Bands) { b.MinStd = 0.6 }},
		{"max_all_success", func(b *Bands) { b.MaxAllSuccess = 2 }},
		{"max_all_zero", func(b *Bands) { b.MaxAllZero = -1 }},
		{"max_constant", func(b *Bands) { b.MaxConstant = math.Inf(1) }},
		{"min_informative", func(b *Bands) { b.MinInformative = 1.01 }},
		{"success_threshold", func(b *Bands) { b.SuccessThreshold = 0 }},
	}
	for _, tt := range tests {
		b := DefaultBands()
		tt.set(&b)
		err := b.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: error %v, want one naming the field", tt.field, err)
		}
	}
}
