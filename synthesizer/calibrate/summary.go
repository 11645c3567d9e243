package calibrate

import (
	"fmt"
	"math"
	"strings"
)

// PassKs are the k of the pass@k figures (the release's pass@{1,4,8,16}).
var PassKs = []int{1, 4, 8, 16}

// HistogramBins is the number of reward histogram bins.
const HistogramBins = 10

// Group is the rewards of one seed's rollouts, in rollout order. Hinted,
// when set, has one entry per reward: whether that rollout's system prompt
// carried the hint block.
type Group struct {
	Seed    int64     `json:"seed"`
	Rewards []float64 `json:"rewards"`
	Hinted  []bool    `json:"hinted,omitempty"`
}

// PassAt is the share of seeds where any of the first K rollouts succeeded.
type PassAt struct {
	K    int     `json:"k"`
	Rate float64 `json:"rate"`
}

// Verdicts of a calibration.
const (
	Accepted      = "accepted"
	TooEasy       = "too_easy"
	TooHard       = "too_hard"
	Uninformative = "uninformative" // mean and success in band, but rewards barely vary within a seed
	Bimodal       = "bimodal"       // signs of both too easy and too hard
)

// BandFailure is one band a calibration missed.
type BandFailure struct {
	Band  string  `json:"band"`  // the Bands field, e.g. "mean_max"
	Value float64 `json:"value"` // the measured figure
	Bound float64 `json:"bound"` // the bound it crossed
}

func (f BandFailure) String() string {
	op := ">"
	if strings.HasPrefix(f.Band, "min_") || strings.HasSuffix(f.Band, "_min") {
		op = "<"
	}
	return fmt.Sprintf("%s %.3f %s %.3f", figureName(f.Band), f.Value, op, f.Bound)
}

func figureName(band string) string {
	switch band {
	case "mean_min", "mean_max":
		return "mean reward"
	case "success_min", "success_max":
		return "success rate"
	case "min_std":
		return "reward std"
	case "max_all_success":
		return "all-success groups"
	case "max_all_zero":
		return "all-zero groups"
	case "max_constant":
		return "constant groups"
	case "min_informative":
		return "informative groups"
	}
	return band
}

// Summary is the calibration summary of a set of groups.
type Summary struct {
	Seeds    int `json:"seeds"`
	Rollouts int `json:"rollouts"`

	Mean        float64 `json:"mean_reward"`
	SuccessRate float64 `json:"success_rate"`
	Std         float64 `json:"reward_std"` // population std over every rollout

	// Shares of groups (seeds).
	AllSuccess  float64 `json:"all_success_groups"`
	AllZero     float64 `json:"all_zero_groups"`
	Constant    float64 `json:"constant_groups"`
	Informative float64 `json:"informative_groups"`

	// PassAt holds pass@k for each k of PassKs that is at most the smallest
	// group's size (pass@16 needs 16 rollouts per seed).
	PassAt []PassAt `json:"pass_at_k"`
	// Histogram counts rewards in ten bins [0, 0.1), [0.1, 0.2), …,
	// [0.9, 1.0]; a reward of 1.0 is in the last bin.
	Histogram [HistogramBins]int `json:"histogram"`

	// Hinted rollouts and the success rates with and without the hint
	// (TRACE aims at 60–80 % success on hinted rollouts); informational.
	HintedRollouts      int     `json:"hinted_rollouts"`
	HintedSuccessRate   float64 `json:"hinted_success_rate"`
	UnhintedSuccessRate float64 `json:"unhinted_success_rate"`

	Verdict   string        `json:"verdict"`
	Accepted  bool          `json:"accepted"`
	Failures  []BandFailure `json:"failures,omitempty"`
	Diagnosis string        `json:"diagnosis"`

	// Policy names the policy that played the rollouts. Simulated is true
	// when it was not a model (the simulated policy or a scripted test
	// policy): such a calibration says nothing about a real agent, and every
	// place that shows it must say so.
	Policy    string `json:"policy,omitempty"`
	Simulated bool   `json:"simulated"`
}

// PassAtK returns pass@k, and false when it was not computed.
func (s Summary) PassAtK(k int) (float64, bool) {
	for _, p := range s.PassAt {
		if p.K == k {
			return p.Rate, true
		}
	}
	return 0, false
}

// String is a one-line rendering, labeled SIMULATED when it is.
func (s Summary) String() string {
	var b strings.Builder
	if s.Simulated {
		b.WriteString("[SIMULATED] ")
	}
	fmt.Fprintf(&b, "%s: mean %.3f, success %.3f, std %.3f, groups all-success %.2f all-zero %.2f constant %.2f informative %.2f",
		s.Verdict, s.Mean, s.SuccessRate, s.Std, s.AllSuccess, s.AllZero, s.Constant, s.Informative)
	for _, p := range s.PassAt {
		fmt.Fprintf(&b, ", pass@%d %.2f", p.K, p.Rate)
	}
	fmt.Fprintf(&b, " (%d seeds × %d rollouts", s.Seeds, s.Rollouts/max(s.Seeds, 1))
	if s.Policy != "" {
		b.WriteString(", policy " + s.Policy)
	}
	b.WriteString(")")
	return b.String()
}

// constEps is how far rewards of one group may differ and still count as
// one constant reward (float noise of sums of components).
const constEps = 1e-9

// Summarize computes the calibration summary of groups against bands.
// Every group needs at least one reward, every reward must be in [0, 1],
// and Hinted, when set, must have one entry per reward.
func Summarize(groups []Group, bands Bands) (Summary, error) {
	if err := bands.Validate(); err != nil {
		return Summary{}, err
	}
	if len(groups) == 0 {
		return Summary{}, fmt.Errorf("calibration: no groups to summarize")
	}
	s := Summary{Seeds: len(groups)}
	minSize := math.MaxInt
	var sum float64
	var successes, hintedSucc, unhintedN, unhintedSucc int
	var allSucc, allZero, constant int
	for _, g := range groups {
		if len(g.Rewards) == 0 {
			return Summary{}, fmt.Errorf("calibration: seed %d has no rollouts", g.Seed)
		}
		if g.Hinted != nil && len(g.Hinted) != len(g.Rewards) {
			return Summary{}, fmt.Errorf("calibration: seed %d has %d hinted flags for %d rewards", g.Seed, len(g.Hinted), len(g.Rewards))
		}
		minSize = min(minSize, len(g.Rewards))
		lo, hi := math.Inf(1), math.Inf(-1)
		gs := 0
		for i, r := range g.Rewards {
			if !(r >= 0 && r <= 1) {
				return Summary{}, fmt.Errorf("calibration: seed %d rollout %d: reward %v is outside [0, 1]", g.Seed, i, r)
			}
			sum += r
			lo, hi = min(lo, r), max(hi, r)
			ok := r >= bands.SuccessThreshold
			if ok {
				gs++
			}
			hinted := g.Hinted != nil && g.Hinted[i]
			switch {
			case hinted:
				s.HintedRollouts++
				if ok {
					hintedSucc++
				}
			default:
				unhintedN++
				if ok {
					unhintedSucc++
				}
			}
			s.Histogram[min(int(r*HistogramBins), HistogramBins-1)]++
		}
		successes += gs
		s.Rollouts += len(g.Rewards)
		if gs == len(g.Rewards) {
			allSucc++
		}
		if hi <= 0 {
			allZero++
		}
		if hi-lo <= constEps {
			constant++
		}
	}
	n := float64(s.Rollouts)
	s.Mean = sum / n
	var sq float64
	for _, g := range groups {
		for _, r := range g.Rewards {
			sq += (r - s.Mean) * (r - s.Mean)
		}
	}
	s.Std = math.Sqrt(sq / n)
	s.SuccessRate = float64(successes) / n
	seeds := float64(len(groups))
	s.AllSuccess = float64(allSucc) / seeds
	s.AllZero = float64(allZero) / seeds
	s.Constant = float64(constant) / seeds
	s.Informative = 1 - s.Constant
	if s.HintedRollouts > 0 {
		s.HintedSuccessRate = float64(hintedSucc) / float64(s.HintedRollouts)
	}
	if unhintedN > 0 {
		s.UnhintedSuccessRate = float64(unhintedSucc) / float64(unhintedN)
	}
	for _, k := range PassKs {
		if k > minSize {
			break
		}
		hit := 0
		for _, g := range groups {
			for _, r := range g.Rewards[:k] {
				if r >= bands.SuccessThreshold {
					hit++
					break
				}
			}
		}
		s.PassAt = append(s.PassAt, PassAt{K: k, Rate: float64(hit) / seeds})
	}
	s.judge(bands)
	return s, nil
}

// SummarizeRewards is Summarize over plain reward groups (seeds 0..n-1,
// no hint flags).
func SummarizeRewards(rewards [][]float64, bands Bands) (Summary, error) {
	groups := make([]Group, len(rewards))
	for i, r := range rewards {
		groups[i] = Group{Seed: int64(i), Rewards: r}
	}
	return Summarize(groups, bands)
}

// Advice handed to the repair loop (TRACE-METHOD.md step 2).
const (
	AdviceTooEasy       = "make it harder: more constraints or steps, fewer hints"
	AdviceTooHard       = "make it easier: simpler instances, more hints"
	AdviceUninformative = "rewards barely vary between rollouts of one seed: make the reward multi-level (partial credit for each required action) and the instances more varied"
	AdviceBimodal       = "some seeds are always solved and others never: make the seeds' difficulty more uniform (the same number of required steps per seed, no impossible instances)"
)

// judge sets the verdict, the failed bands and the diagnosis.
func (s *Summary) judge(b Bands) {
	var easy, hard, flat []BandFailure
	if s.Mean > b.MeanMax {
		easy = append(easy, BandFailure{"mean_max", s.Mean, b.MeanMax})
	}
	if s.SuccessRate > b.SuccessMax {
		easy = append(easy, BandFailure{"success_max", s.SuccessRate, b.SuccessMax})
	}
	if s.AllSuccess > b.MaxAllSuccess {
		easy = append(easy, BandFailure{"max_all_success", s.AllSuccess, b.MaxAllSuccess})
	}
	if s.Mean < b.MeanMin {
		hard = append(hard, BandFailure{"mean_min", s.Mean, b.MeanMin})
	}
	if s.SuccessRate < b.SuccessMin {
		hard = append(hard, BandFailure{"success_min", s.SuccessRate, b.SuccessMin})
	}
	if s.AllZero > b.MaxAllZero {
		hard = append(hard, BandFailure{"max_all_zero", s.AllZero, b.MaxAllZero})
	}
	if s.Std < b.MinStd {
		flat = append(flat, BandFailure{"min_std", s.Std, b.MinStd})
	}
	if s.Constant > b.MaxConstant {
		flat = append(flat, BandFailure{"max_constant", s.Constant, b.MaxConstant})
	}
	if s.Informative < b.MinInformative {
		flat = append(flat, BandFailure{"min_informative", s.Informative, b.MinInformative})
	}
	s.Failures = append(append(append([]BandFailure(nil), easy...), hard...), flat...)
	list := func(fs []BandFailure) string {
		parts := make([]string, len(fs))
		for i, f := range fs {
			parts[i] = f.String()
		}
		return strings.Join(parts, ", ")
	}
	var d []string
	switch {
	case len(s.Failures) == 0:
		s.Verdict, s.Accepted = Accepted, true
		s.Diagnosis = fmt.Sprintf("accepted: mean reward %.3f, success rate %.3f, reward std %.3f, informative groups %.2f are inside the bands",
			s.Mean, s.SuccessRate, s.Std, s.Informative)
		return
	case len(easy) > 0 && len(hard) == 0:
		s.Verdict = TooEasy
		d = append(d, "too easy ("+list(easy)+"): "+AdviceTooEasy)
	case len(hard) > 0 && len(easy) == 0:
		s.Verdict = TooHard
		d = append(d, "too hard ("+list(hard)+"): "+AdviceTooHard)
	case len(easy) > 0:
		s.Verdict = Bimodal
		d = append(d, "both too easy and too hard ("+list(append(append([]BandFailure(nil), easy...), hard...))+"): "+AdviceBimodal)
	default:
		s.Verdict = Uninformative
	}
	if len(flat) > 0 {
		d = append(d, "not informative ("+list(flat)+"): "+AdviceUninformative)
	}
	s.Diagnosis = strings.Join(d, "; ")
}
