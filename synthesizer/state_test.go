package synthesizer

import (
	"strings"
	"testing"
)

func TestStepTable(t *testing.T) {
	gen := func(path Path, attempt int, diags ...string) Machine {
		return Machine{Status: StatusGenerating, Path: path, Attempt: attempt, Diagnoses: diags}
	}
	at := func(s Status, path Path, attempt int, diags ...string) Machine {
		return Machine{Status: s, Path: path, Attempt: attempt, Diagnoses: diags}
	}
	tests := []struct {
		name       string
		m          Machine
		ev         Event
		want       Status
		act        Action
		attempt    int
		path       Path
		reason     string // substring of Reason
		lastDiag   string // substring of the last diagnosis
		wantErr    bool
		diagnosesN int
	}{
		{name: "llm configured", m: Start(0), ev: Event{Kind: EvStart, HaveLLM: true, HaveTemplate: true},
			want: StatusGenerating, act: ActWrite, attempt: 1, path: PathLLM},
		{name: "template without llm", m: Start(0), ev: Event{Kind: EvStart, HaveTemplate: true},
			want: StatusGenerating, act: ActWrite, attempt: 1, path: PathTemplate},
		{name: "neither", m: Start(0), ev: Event{Kind: EvStart},
			want: StatusWaitingForLLM, act: ActWait, reason: "no generation model"},
		{name: "waiting resumes with a model", m: Machine{Status: StatusWaitingForLLM, Reason: "x"}, ev: Event{Kind: EvStart, HaveLLM: true},
			want: StatusGenerating, act: ActWrite, attempt: 1, path: PathLLM},
		{name: "waiting stays without a model", m: Machine{Status: StatusWaitingForLLM, Reason: "template cannot be used: no tool"},
			ev: Event{Kind: EvStart, HaveTemplate: true, TemplateTried: true}, want: StatusWaitingForLLM, act: ActWait, reason: "template cannot be used"},
		{name: "waiting for a policy takes its template once there is one", m: Machine{Status: StatusWaitingForLLM, Reason: "no policy model"},
			ev: Event{Kind: EvStart, HaveTemplate: true}, want: StatusGenerating, act: ActWrite, attempt: 1, path: PathTemplate},
		{name: "no policy waits with the reason", m: Start(0), ev: Event{Kind: EvStart, Reason: "no policy model to calibrate with for a/b"},
			want: StatusWaitingForLLM, act: ActWait, reason: "no policy model to calibrate with for a/b"},
		{name: "written", m: gen(PathLLM, 1), ev: Event{Kind: EvWritten}, want: StatusValidating, act: ActValidate, attempt: 1},
		{name: "no program is a failed attempt", m: gen(PathLLM, 1), ev: Event{Kind: EvWriteFailed, Reason: "the answer has no code block"},
			want: StatusGenerating, act: ActWrite, attempt: 2, lastDiag: "attempt 1: generation: the answer has no code block", diagnosesN: 1},
		{name: "valid", m: at(StatusValidating, PathLLM, 2), ev: Event{Kind: EvValid}, want: StatusCalibrating, act: ActCalibrate, attempt: 2},
		{name: "invalid repairs", m: at(StatusValidating, PathLLM, 2, "attempt 1: x"), ev: Event{Kind: EvInvalid, Reason: "determinism: seed 3"},
			want: StatusGenerating, act: ActWrite, attempt: 3, lastDiag: "attempt 2: validation: determinism: seed 3", diagnosesN: 2},
		{name: "accepted", m: at(StatusCalibrating, PathLLM, 3), ev: Event{Kind: EvAccepted}, want: StatusDone, act: ActPublish, attempt: 3},
		{name: "too easy repairs", m: at(StatusCalibrating, PathTemplate, 1), ev: Event{Kind: EvRejected, Reason: "too easy: success 0.9"},
			want: StatusGenerating, act: ActWrite, attempt: 2, path: PathTemplate, lastDiag: "calibration: too easy", diagnosesN: 1},
		{name: "fifth failure is FAILED", m: at(StatusCalibrating, PathLLM, 5, "1", "2", "3", "4"), ev: Event{Kind: EvRejected, Reason: "too hard"},
			want: StatusFailed, act: ActGiveUp, attempt: 5, reason: "5 attempts, none accepted; last: calibration: too hard", diagnosesN: 5},
		{name: "fifth no-program is FAILED", m: gen(PathLLM, 5), ev: Event{Kind: EvWriteFailed, Reason: "empty answer"},
			want: StatusFailed, act: ActGiveUp, attempt: 5, reason: "last: generation: empty answer"},
		{name: "max attempts configurable", m: Machine{Status: StatusValidating, Path: PathLLM, Attempt: 2, MaxAttempts: 2}, ev: Event{Kind: EvInvalid, Reason: "r"},
			want: StatusFailed, act: ActGiveUp, attempt: 2, reason: "2 attempts"},
		{name: "template that cannot adapt waits for a model", m: gen(PathTemplate, 1), ev: Event{Kind: EvWriteFailed, Reason: "target has no read tool", Final: true},
			want: StatusWaitingForLLM, act: ActWait, reason: "template cannot be used: generation: target has no read tool"},
		{name: "final llm failure", m: at(StatusValidating, PathLLM, 1), ev: Event{Kind: EvInvalid, Reason: "r", Final: true},
			want: StatusFailed, act: ActGiveUp, reason: "validation: r"},
		{name: "resume mid-calibration rewrites the attempt", m: at(StatusCalibrating, PathLLM, 3), ev: Event{Kind: EvStart, HaveLLM: true},
			want: StatusGenerating, act: ActWrite, attempt: 3},
		{name: "resume mid-generation", m: gen(PathTemplate, 2), ev: Event{Kind: EvStart, HaveTemplate: true}, want: StatusGenerating, act: ActWrite, attempt: 2},
		{name: "resume mid-generation without its model waits, keeping the attempt", m: gen(PathLLM, 3, "1", "2"), ev: Event{Kind: EvStart},
			want: StatusWaitingForLLM, act: ActWait, attempt: 3, path: PathLLM, reason: "no generation model", diagnosesN: 2},
		{name: "resume mid-validation without its model takes the template", m: at(StatusValidating, PathLLM, 2, "1"), ev: Event{Kind: EvStart, HaveTemplate: true},
			want: StatusGenerating, act: ActWrite, attempt: 1, path: PathTemplate},
		{name: "resume without templates waits", m: at(StatusCalibrating, PathTemplate, 2, "1"), ev: Event{Kind: EvStart},
			want: StatusWaitingForLLM, act: ActWait, attempt: 2, path: PathTemplate},
		{name: "resume mid-calibration without a policy waits with the reason", m: at(StatusCalibrating, PathLLM, 2, "1"),
			ev: Event{Kind: EvStart, Reason: "no policy model to calibrate with for a/b"}, want: StatusWaitingForLLM, act: ActWait, reason: "no policy model"},
		{name: "waiting mid-path resumes its attempt", m: at(StatusWaitingForLLM, PathLLM, 3, "1", "2"), ev: Event{Kind: EvStart, HaveLLM: true},
			want: StatusGenerating, act: ActWrite, attempt: 3, path: PathLLM, diagnosesN: 2},
		{name: "abort", m: at(StatusCalibrating, PathLLM, 2), ev: Event{Kind: EvAbort, Reason: "delivered 5 times"},
			want: StatusFailed, act: ActGiveUp, reason: "delivered 5 times"},
		{name: "abort pending", m: Start(0), ev: Event{Kind: EvAbort, Reason: "r"}, want: StatusFailed, act: ActGiveUp},
		{name: "done ignores a redelivery", m: Machine{Status: StatusDone, Attempt: 2}, ev: Event{Kind: EvStart, HaveLLM: true},
			want: StatusDone, act: ActNone, attempt: 2},
		{name: "failed ignores a redelivery", m: Machine{Status: StatusFailed}, ev: Event{Kind: EvStart}, want: StatusFailed, act: ActNone},
		{name: "done ignores abort", m: Machine{Status: StatusDone}, ev: Event{Kind: EvAbort}, want: StatusDone, act: ActNone},
		{name: "validation result while generating", m: gen(PathLLM, 1), ev: Event{Kind: EvValid}, want: StatusGenerating, wantErr: true},
		{name: "written while pending", m: Start(0), ev: Event{Kind: EvWritten}, want: StatusPending, wantErr: true},
		{name: "accepted after done", m: Machine{Status: StatusDone}, ev: Event{Kind: EvAccepted}, want: StatusDone, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(tt.m.Diagnoses)
			got, act, err := Step(tt.m, tt.ev)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if got.Status != tt.want || act != tt.act {
				t.Fatalf("-> %s/%s, want %s/%s (machine %+v)", got.Status, act, tt.want, tt.act, got)
			}
			if tt.attempt != 0 && got.Attempt != tt.attempt {
				t.Errorf("attempt %d, want %d", got.Attempt, tt.attempt)
			}
			if tt.path != "" && got.Path != tt.path {
				t.Errorf("path %q, want %q", got.Path, tt.path)
			}
			if !strings.Contains(got.Reason, tt.reason) {
				t.Errorf("reason %q, want it to contain %q", got.Reason, tt.reason)
			}
			if tt.diagnosesN != 0 && len(got.Diagnoses) != tt.diagnosesN {
				t.Errorf("%d diagnoses, want %d: %q", len(got.Diagnoses), tt.diagnosesN, got.Diagnoses)
			}
			if tt.lastDiag != "" && (len(got.Diagnoses) == 0 || !strings.Contains(got.Diagnoses[len(got.Diagnoses)-1], tt.lastDiag)) {
				t.Errorf("diagnoses %q, want the last to contain %q", got.Diagnoses, tt.lastDiag)
			}
			if len(tt.m.Diagnoses) != before {
				t.Error("Step changed its argument's diagnoses")
			}
			if (got.Status == StatusDone || got.Status == StatusFailed) != got.Status.Terminal() {
				t.Error("Terminal disagrees")
			}
		})
	}
}

// TestStepNeverDoneAfterFiveFailures drives the machine through every mix of
// failures: whatever fails, five failed attempts end FAILED, never DONE, and
// no more than five programs are asked for.
func TestStepNeverDoneAfterFiveFailures(t *testing.T) {
	failures := []Event{{Kind: EvWriteFailed, Reason: "w"}, {Kind: EvInvalid, Reason: "v"}, {Kind: EvRejected, Reason: "c"}}
	for mask := 0; mask < 243; mask++ { // 3^5 sequences
		m, act, err := Step(Start(0), Event{Kind: EvStart, HaveLLM: true})
		writes := 0
		for code := mask; act == ActWrite; code /= 3 {
			if err != nil {
				t.Fatal(err)
			}
			writes++
			switch f := failures[code%3]; f.Kind {
			case EvWriteFailed:
				m, act, err = Step(m, f)
			case EvInvalid:
				if m, _, err = Step(m, Event{Kind: EvWritten}); err == nil {
					m, act, err = Step(m, f)
				}
			default:
				if m, _, err = Step(m, Event{Kind: EvWritten}); err == nil {
					if m, _, err = Step(m, Event{Kind: EvValid}); err == nil {
						m, act, err = Step(m, f)
					}
				}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != StatusFailed || act != ActGiveUp || writes != DefaultMaxAttempts || len(m.Diagnoses) != DefaultMaxAttempts {
			t.Fatalf("sequence %d: %s/%s after %d writes, %d diagnoses", mask, m.Status, act, writes, len(m.Diagnoses))
		}
	}
}
