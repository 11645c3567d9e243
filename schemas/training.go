package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Schema values of the training messages.
const (
	TrainingJobSchema   = "training_job/v1"
	TrainingEventSchema = "training_event/v1"
	// SubjectTrainingEvents prefixes a job's event subject:
	// trace.training.events.<job_id>.
	SubjectTrainingEvents = "trace.training.events"
)

// TrainingJob is one LoRA adapter training run for one ready environment
// and plan revision (schema training_job/v1).
type TrainingJob struct {
	Schema        string        `json:"schema"`
	JobID         string        `json:"job_id"`
	PlanRevision  int           `json:"plan_revision"`
	EnvironmentID string        `json:"environment_id"`
	Environment   string        `json:"environment"`
	AgentVersion  string        `json:"agent_version"`
	Capability    JobCapability `json:"capability"`
	ProgramHash   string        `json:"program_hash"`
	EnvServer     JobEnvServer  `json:"env_server"`
	BaseModel     string        `json:"base_model"`
	LoRA          LoRASettings  `json:"lora"`
	GRPO          GRPOSettings  `json:"grpo"`
	Eval          EvalPlan      `json:"eval"`
	TrainSeeds    *SeedRange    `json:"train_seeds,omitempty"`
	Output        JobOutput     `json:"output"`
	Report        JobReport     `json:"report"`
	Planner       PlannerRecord `json:"planner"`
	Simulated     bool          `json:"simulated,omitempty"`
	CreatedAt     time.Time     `json:"created_at"`
}

// JobCapability is the capability the adapter trains.
type JobCapability struct {
	Name       string `json:"name"`
	Definition string `json:"definition"`
}

// JobEnvServer says where the trainer plays the environment.
type JobEnvServer struct {
	BaseURL  string `json:"base_url"`
	TokenEnv string `json:"token_env,omitempty"`
	MaxSteps int    `json:"max_steps,omitempty"`
}

// LoRASettings are PEFT LoraConfig's settings.
type LoRASettings struct {
	Rank          int      `json:"rank"`
	Alpha         int      `json:"alpha"`
	Dropout       float64  `json:"dropout"`
	TargetModules []string `json:"target_modules"`
}

// Advantage estimators.
const (
	AdvantageGroupStd  = "group_std"  // (r − mean) / (std + ε): the paper
	AdvantageGroupMean = "group_mean" // r − mean: the release
)

// GRPOSettings are the GRPO settings of a run.
type GRPOSettings struct {
	GroupSize          int     `json:"group_size"`
	GroupsPerIteration int     `json:"groups_per_iteration"`
	Iterations         int     `json:"iterations"`
	LearningRate       float64 `json:"learning_rate"`
	Temperature        float64 `json:"temperature"`
	KLCoef             float64 `json:"kl_coef"`
	ClipEpsilon        float64 `json:"clip_epsilon"`
	MaxGradNorm        float64 `json:"max_grad_norm"`
	HintRatio          float64 `json:"hint_ratio"`
	StripHints         bool    `json:"strip_hints"`
	DropConstantGroups bool    `json:"drop_constant_groups"`
	Advantage          string  `json:"advantage"`
}

// EvalPlan is how the adapter is evaluated: held-out seeds.
type EvalPlan struct {
	Seeds            []int64 `json:"seeds"`
	RolloutsPerSeed  int     `json:"rollouts_per_seed"`
	SuccessThreshold float64 `json:"success_threshold"`
}

// SeedRange is a range of training seeds [First, First+Count).
type SeedRange struct {
	First int64 `json:"first"`
	Count int64 `json:"count"`
}

// JobOutput says where the adapter goes and what it is served as.
type JobOutput struct {
	AdapterName string `json:"adapter_name"`
	URI         string `json:"uri"`
}

// JobReport says how the trainer reports.
type JobReport struct {
	EventsSubject    string `json:"events_subject"`
	CallbackURL      string `json:"callback_url,omitempty"`
	HeartbeatSeconds int    `json:"heartbeat_seconds"`
	DeadlineSeconds  int    `json:"deadline_seconds"`
}

// Plan sources.
const (
	PlanDefaults = "defaults"
	PlanConfig   = "config"
	PlanAgent    = "agent"
	PlanCLI      = "cli"
)

// Outcomes of the planning agent (PlannerRecord.Agent).
const (
	AgentAccepted  = "accepted"  // its adjustment is in the plan
	AgentUnchanged = "unchanged" // it kept the plan as it was
	AgentRejected  = "rejected"  // its adjustment was out of bounds: the plan stands
	AgentFailed    = "failed"    // no valid answer (schema, unreachable): the plan stands
)

// PlannerRecord says who made the plan and why. Agent, Reason and Error
// record the planning agent when one is configured: its outcome, its own
// reason (also for a rejected plan), and why its answer was rejected or
// failed (naming the field); RejectedFields lists the settings out of
// bounds.
type PlannerRecord struct {
	Source         string   `json:"source"`
	Preset         string   `json:"preset"`
	Overrides      []string `json:"overrides,omitempty"`
	Model          string   `json:"model,omitempty"`
	Reason         string   `json:"reason,omitempty"`
	Agent          string   `json:"agent,omitempty"`
	Error          string   `json:"error,omitempty"`
	RejectedFields []string `json:"rejected_fields,omitempty"`
}

// TrainingJobID is the job id of an (environment, plan revision): "job-"
// and the first 16 hex digits of sha256(environment id, NUL, revision). A
// redelivered ready event yields the same id.
func TrainingJobID(environmentID string, revision int) string {
	h := sha256.Sum256([]byte(environmentID + "\x00" + strconv.Itoa(revision)))
	return "job-" + hex.EncodeToString(h[:8])
}

// TrainingEventsSubject is trace.training.events.<job_id>.
func TrainingEventsSubject(jobID string) string { return SubjectTrainingEvents + "." + jobID }

// DecodeTrainingJob decodes and validates a training job strictly (no
// unknown field at any level), and checks that its id, events subject and
// revision agree.
func DecodeTrainingJob(data []byte) (*TrainingJob, error) {
	j, err := decodeStrict[TrainingJob](data, KindTrainingJob, DecodeOptions{})
	if err != nil {
		return nil, err
	}
	if want := TrainingJobID(j.EnvironmentID, j.PlanRevision); j.JobID != want {
		return nil, &Error{Reason: ReasonSchema, Path: "/job_id", Rule: "consistency",
			Msg: fmt.Sprintf("%q is not the id of environment %s revision %d (%s)", j.JobID, j.EnvironmentID, j.PlanRevision, want)}
	}
	if want := TrainingEventsSubject(j.JobID); j.Report.EventsSubject != want {
		return nil, &Error{Reason: ReasonSchema, Path: "/report/events_subject", Rule: "consistency",
			Msg: fmt.Sprintf("%q is not the job's subject %q", j.Report.EventsSubject, want)}
	}
	return j, nil
}

// Encode validates and encodes a job: trace never sends an invalid one.
func (j *TrainingJob) Encode() ([]byte, error) {
	j.Schema = TrainingJobSchema
	data, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	if _, err := DecodeTrainingJob(data); err != nil {
		return nil, fmt.Errorf("training job %s: %w", j.JobID, err)
	}
	return data, nil
}

// Training event types.
const (
	EventStarted   = "started"
	EventProgress  = "progress"
	EventHeartbeat = "heartbeat"
	EventSucceeded = "succeeded"
	EventFailed    = "failed"
)

// TrainingEvent is what a trainer reports (schema training_event/v1).
type TrainingEvent struct {
	Schema     string        `json:"schema"`
	JobID      string        `json:"job_id"`
	Type       string        `json:"type"`
	At         time.Time     `json:"at"`
	Seq        *int64        `json:"seq,omitempty"`
	Worker     string        `json:"worker,omitempty"`
	Simulated  bool          `json:"simulated,omitempty"`
	Iteration  *int          `json:"iteration,omitempty"`
	Iterations int           `json:"iterations,omitempty"`
	MeanReward *float64      `json:"mean_reward,omitempty"`
	RewardStd  *float64      `json:"reward_std,omitempty"`
	KL         *float64      `json:"kl,omitempty"`
	Loss       *float64      `json:"loss,omitempty"`
	Adapter    *EventAdapter `json:"adapter,omitempty"`
	Eval       *EvalMetrics  `json:"eval,omitempty"`
	Reason     string        `json:"reason,omitempty"`
}

// MaxAdapterURI bounds an adapter's URI, in characters (PATH_MAX for a
// local path): a job's output.uri (training_job/v1) and a succeeded
// event's adapter.uri (training_event/v1) carry it as their maxLength, so
// that a trainer can always report where it wrote what it was asked to.
const MaxAdapterURI = 4096

// EventAdapter is the adapter a succeeded job wrote.
type EventAdapter struct {
	Name string `json:"name"`
	URI  string `json:"uri"`
}

// EvalMetrics are the held-out evaluation's results.
type EvalMetrics struct {
	MeanReward     float64  `json:"mean_reward"`
	SuccessRate    float64  `json:"success_rate"`
	Episodes       int      `json:"episodes"`
	BaseMeanReward *float64 `json:"base_mean_reward,omitempty"`
}

// DecodeTrainingEvent decodes and validates a training event strictly.
func DecodeTrainingEvent(data []byte) (*TrainingEvent, error) {
	e, err := decodeStrict[TrainingEvent](data, KindTrainingEvent, DecodeOptions{MaxBytes: 1 << 20})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Encode validates and encodes an event.
func (e *TrainingEvent) Encode() ([]byte, error) {
	e.Schema = TrainingEventSchema
	data, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	if _, err := DecodeTrainingEvent(data); err != nil {
		return nil, fmt.Errorf("training event %s %s: %w", e.JobID, e.Type, err)
	}
	return data, nil
}
