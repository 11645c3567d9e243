package calibrate

import "fmt"

// Bands are the acceptance bands of a calibration (TRACE-METHOD.md step 2,
// the authors' calibrate_environment.py). Every field is explicit: a zero
// is a real bound, so start from DefaultBands and change what you need.
type Bands struct {
	// MeanMin and MeanMax bound the mean reward over every rollout.
	MeanMin float64 `json:"mean_min" yaml:"mean_min"`
	MeanMax float64 `json:"mean_max" yaml:"mean_max"`
	// SuccessMin and SuccessMax bound the success rate: the share of
	// rollouts whose reward is at least SuccessThreshold.
	SuccessMin float64 `json:"success_min" yaml:"success_min"`
	SuccessMax float64 `json:"success_max" yaml:"success_max"`
	// MinStd is the least population standard deviation of the rewards.
	MinStd float64 `json:"min_std" yaml:"min_std"`
	// MaxAllSuccess, MaxAllZero and MaxConstant bound the shares of seeds
	// whose group is all successes, all zero rewards, or one constant reward
	// (all-success and all-zero groups are constant too).
	MaxAllSuccess float64 `json:"max_all_success" yaml:"max_all_success"`
	MaxAllZero    float64 `json:"max_all_zero" yaml:"max_all_zero"`
	MaxConstant   float64 `json:"max_constant" yaml:"max_constant"`
	// MinInformative is the least share of informative (non-constant)
	// groups, the only ones that give GRPO a gradient.
	MinInformative float64 `json:"min_informative" yaml:"min_informative"`
	// SuccessThreshold is the reward that counts as a success (TRACE: 1.0).
	SuccessThreshold float64 `json:"success_threshold" yaml:"success_threshold"`
}

// DefaultBands are the release's bands: mean and success rate in
// [0.2, 0.6], std ≥ 0.05, all-success ≤ 0.2, all-zero ≤ 0.2, constant ≤ 0.5,
// informative ≥ 0.5, success = reward ≥ 1.0.
func DefaultBands() Bands {
	return Bands{
		MeanMin: 0.2, MeanMax: 0.6,
		SuccessMin: 0.2, SuccessMax: 0.6,
		MinStd:        0.05,
		MaxAllSuccess: 0.2, MaxAllZero: 0.2, MaxConstant: 0.5,
		MinInformative:   0.5,
		SuccessThreshold: 1.0,
	}
}

// Validate reports the first bad field by its name: every bound is a share
// or a reward in [0, 1], each minimum at most its maximum, and the success
// threshold above 0.
func (b Bands) Validate() error {
	if err := b.check(func(key string) string { return key }); err != nil {
		return fmt.Errorf("calibration bands: %w", err)
	}
	return nil
}

// check is Validate with each band named by name(key).
func (b Bands) check(name func(key string) string) error {
	unit := []struct {
		name string
		v    float64
	}{
		{"mean_min", b.MeanMin}, {"mean_max", b.MeanMax},
		{"success_min", b.SuccessMin}, {"success_max", b.SuccessMax},
		{"min_std", b.MinStd},
		{"max_all_success", b.MaxAllSuccess}, {"max_all_zero", b.MaxAllZero}, {"max_constant", b.MaxConstant},
		{"min_informative", b.MinInformative},
		{"success_threshold", b.SuccessThreshold},
	}
	for _, f := range unit {
		if !(f.v >= 0 && f.v <= 1) { // also rejects NaN
			return fmt.Errorf("%s = %v, want a value in [0, 1]", name(f.name), f.v)
		}
	}
	if b.MeanMin > b.MeanMax {
		return fmt.Errorf("%s = %v is above %s = %v", name("mean_min"), b.MeanMin, name("mean_max"), b.MeanMax)
	}
	if b.SuccessMin > b.SuccessMax {
		return fmt.Errorf("%s = %v is above %s = %v", name("success_min"), b.SuccessMin, name("success_max"), b.SuccessMax)
	}
	if b.MinStd > 0.5 {
		return fmt.Errorf("%s = %v, want at most 0.5 (the largest std of rewards in [0, 1])", name("min_std"), b.MinStd)
	}
	if b.SuccessThreshold == 0 {
		return fmt.Errorf("%s = 0, want a reward in (0, 1]", name("success_threshold"))
	}
	return nil
}
