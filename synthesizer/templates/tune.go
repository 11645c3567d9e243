package templates

import (
	"context"
	"errors"
	"fmt"

	"github.com/traceops/trace/schemas"
	"github.com/traceops/trace/synthesizer/calibrate"
	"github.com/traceops/trace/synthesizer/envprog"
)

// ErrNotCalibrated is returned (wrapped) by Tune when no knob setting it
// tried landed inside the bands. The Tuned result still lists every
// attempt; the caller must not treat its template as calibrated.
var ErrNotCalibrated = errors.New("templates: no knob setting calibrated inside the bands")

// Attempt is one calibration of one knob setting.
type Attempt struct {
	Knobs   Knobs             `json:"knobs"`
	Hash    string            `json:"program_hash"`
	Summary calibrate.Summary `json:"summary"`
}

// Tuned is the outcome of Tune.
type Tuned struct {
	// Template and Result are those of the accepted attempt, or of the
	// last one when none was accepted.
	Template *Template         `json:"template"`
	Result   *calibrate.Result `json:"-"`
	Attempts []Attempt         `json:"attempts"`
	Accepted bool              `json:"accepted"`
}

// TuneConfig sets Tune. Calibration is the calibration run of every
// attempt (its hint share is replaced by the knobs'; a zero Config means
// calibrate.DefaultConfig()); MaxAttempts bounds the attempts (0 means 6);
// Limits are the runtime limits of the programs.
type TuneConfig struct {
	Calibration calibrate.Config
	MaxAttempts int
	Limits      envprog.Limits
	// Attempted, when set, is called after each attempt.
	Attempted func(Attempt)
}

// Tune instantiates family for the target's tools and calibrates it with
// policy, turning the difficulty knobs until the calibration is accepted:
// too easy moves one rung up the family's ladder (more steps, records and
// distractors) and, at the top, lowers the hint share; too hard moves one
// rung down and, at the bottom, raises the hint share. It stops when a
// setting is accepted, when it would go back to a setting it already tried
// (no rung fits: the bands lie between two adjacent rungs), or after
// MaxAttempts. A program or policy error is returned as is; a search that
// ends without an accepted setting returns the Tuned with Accepted false and
// an error wrapping ErrNotCalibrated with the last diagnosis.
func Tune(ctx context.Context, family string, tools []schemas.Tool, policy calibrate.Policy, cfg TuneConfig) (*Tuned, error) {
	f, ok := Lookup(family)
	if !ok {
		_, err := Instantiate(family, tools, Knobs{})
		return nil, err
	}
	if cfg.Calibration.Seeds == 0 && cfg.Calibration.Rollouts == 0 {
		cfg.Calibration = calibrate.DefaultConfig()
	}
	maxAttempts := cfg.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = 6
	}
	level := f.Start
	hints := [2]float64{f.Ladder[level].HintShareMin, f.Ladder[level].HintShareMax}
	tried := map[Knobs]bool{}
	out := &Tuned{}
	for len(out.Attempts) < maxAttempts {
		knobs := f.Ladder[level]
		knobs.HintShareMin, knobs.HintShareMax = hints[0], hints[1]
		if tried[knobs] {
			break
		}
		tried[knobs] = true
		tpl, err := Instantiate(family, tools, knobs)
		if err != nil {
			return nil, err
		}
		res, err := calibrateTemplate(ctx, tpl, policy, cfg)
		if err != nil {
			return nil, err
		}
		a := Attempt{Knobs: knobs, Hash: res.hash, Summary: res.Summary}
		out.Attempts = append(out.Attempts, a)
		out.Template, out.Result = tpl, res.Result
		if cfg.Attempted != nil {
			cfg.Attempted(a)
		}
		if res.Summary.Accepted {
			out.Accepted = true
			return out, nil
		}
		harder := res.Summary.Verdict == calibrate.TooEasy ||
			(res.Summary.Verdict != calibrate.TooHard && res.Summary.Mean > (cfg.Calibration.Bands.MeanMin+cfg.Calibration.Bands.MeanMax)/2)
		switch {
		case harder && level < len(f.Ladder)-1:
			level++
		case harder:
			hints = [2]float64{max(hints[0]-0.1, 0), max(hints[1]-0.15, 0.1)}
		case level > 0:
			level--
		default:
			hints = [2]float64{min(hints[0]+0.15, 0.5), min(hints[1]+0.15, 0.65)}
		}
	}
	last := out.Attempts[len(out.Attempts)-1].Summary
	return out, fmt.Errorf("%w: %s after %d attempts, last %s", ErrNotCalibrated, family, len(out.Attempts), last.Diagnosis)
}

type calibrated struct {
	*calibrate.Result
	hash string
}

func calibrateTemplate(ctx context.Context, tpl *Template, policy calibrate.Policy, cfg TuneConfig) (calibrated, error) {
	// Templates are trusted code shipped with trace: they run in-process.
	env, err := envprog.Load(ctx, tpl.Name, tpl.Program, cfg.Limits)
	if err != nil {
		return calibrated{}, fmt.Errorf("templates: %s: %w", tpl.Family, err)
	}
	defer env.Close()
	res, err := calibrate.Run(ctx, env, policy, tpl.CalibrationConfig(cfg.Calibration))
	if err != nil {
		return calibrated{}, fmt.Errorf("templates: %s (%s): %w", tpl.Family, tpl.Knobs, err)
	}
	return calibrated{Result: res, hash: env.Info().Hash}, nil
}
