"""python -m trace_trainer: trace's reference trainer.

  --spec PATH      the command protocol: run the job in PATH, print its
                   events as JSON lines on stdout (logs on stderr); exit 0
                   when it succeeded, 1 when it failed, 2 on a bad spec.
  --nats URL       the nats protocol: take jobs from the JetStream work queue
                   trace.training.jobs (durable consumer trace-trainers), one
                   at a time, and publish events on each job's events subject,
                   until SIGTERM. A NATS outage does not stop a job; its
                   terminal event is retried until delivered, and kept in
                   --spool-dir for the next start if the worker stops first.
                   A job is acked once its terminal event is out (in-progress
                   acks meanwhile): a job whose worker dies is redelivered to
                   another; one delivered more than --max-deliveries times is
                   reported failed. On SIGTERM the running job stops after its
                   current step and is handed back (nak, no terminal event)
                   for another worker to train from the start.
"""

import argparse
import importlib.util
import json
import os
import sys
import traceback

from .events import Emitter, stdout_sink

try:
    from . import train
except ImportError as _e:  # a Python without the trainer's dependencies
    train = None
    _import_error = _e
else:
    _import_error = None


# What a job imports (train.py imports the heavy ones only when a job
# starts) and the nats worker: a venv built partly may hold some of them.
_JOB_MODULES = ("openenv", "torch", "transformers", "trl", "peft", "datasets")
_WORKER_MODULES = ("nats",)


def missing_dependencies(worker: bool = False) -> str:
    """Why this Python cannot train (for the nats worker too, with worker),
    and the fix; "" when it can."""
    if _import_error is not None:
        why = f"{type(_import_error).__name__}: {_import_error}"
    else:
        names = _JOB_MODULES + (_WORKER_MODULES if worker else ())
        missing = [m for m in names if importlib.util.find_spec(m) is None]
        if not missing:
            return ""
        why = "not installed: " + ", ".join(missing)
    req = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")
    return (f"{sys.executable} cannot import the trainer's dependencies ({why}); "
            f"install them into a venv and run the trainer with its python: python3 -m venv VENV && "
            f"VENV/bin/pip install -r {req}, then VENV/bin/python -m trace_trainer "
            f"(with trace's command backend: adapter.command.argv[0] = VENV/bin/python)")


def _options(a):
    return train.Options(max_completion_length=a.max_completion_length, max_tool_calls=a.max_tool_calls,
                         episodes_log=a.episodes_log, seed=a.seed, cpu=a.cpu)


def check_job(job) -> None:
    """The fields the trainer reads; the adapt role validated the rest
    against training_job/v1."""
    if not isinstance(job, dict) or job.get("schema") != "training_job/v1":
        raise ValueError("schema: not a training_job/v1")
    for path in ("job_id", "base_model", "env_server.base_url", "lora.rank", "lora.alpha", "lora.dropout",
                 "lora.target_modules", "grpo.group_size", "grpo.groups_per_iteration", "grpo.iterations",
                 "grpo.learning_rate", "grpo.temperature", "grpo.kl_coef", "grpo.clip_epsilon", "grpo.max_grad_norm",
                 "grpo.hint_ratio", "grpo.advantage", "eval.seeds", "eval.rollouts_per_seed",
                 "eval.success_threshold", "output.adapter_name", "output.uri", "report.events_subject"):
        v = job
        for k in path.split("."):
            if not isinstance(v, dict) or k not in v:
                raise ValueError(f"{path}: missing")
            v = v[k]


# run_job's result for a job stopped by the trainer's stop request when the
# caller hands such a job back (hand_back=True): no terminal event emitted.
HANDED_BACK = "handed back"


def run_job(job: dict, emitter: Emitter, opts: "train.Options", hand_back: bool = False) -> "bool | str":
    """Runs job, emitting its events through emitter: True when it
    succeeded, False when it failed (its terminal event emitted). A job
    stopped by the trainer's stop request (train.Stopped) is reported failed
    too, unless hand_back (the nats worker: the job goes back to the work
    queue for another worker): then no terminal event, and HANDED_BACK."""
    emitter.start_heartbeat()
    try:
        try:
            result = train.run(job, emitter.emit, opts)
        except Exception as e:
            if hand_back and isinstance(e, train.Stopped):
                return HANDED_BACK
            traceback.print_exc(file=sys.stderr)
            reason = str(e) if isinstance(e, train.JobError) else f"{type(e).__name__}: {e}"
            emitter.emit("failed", reason=reason[:2000])
            return False
        # Outside the try: a trained adapter is never reported failed
        # because its succeeded event could not be written.
        emitter.emit("succeeded", **result)
        return True
    finally:
        emitter.stop_heartbeat()


def _at_least(lo: int, why: str = ""):
    """An argparse type: an integer >= lo."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}{why}, got {v}")
        return v
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trace_trainer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--spec", help="job spec file (training_job/v1 JSON): the command protocol")
    mode.add_argument("--nats", help="NATS URL (e.g. nats://127.0.0.1:4222): the nats protocol worker")
    p.add_argument("--max-completion-length", type=_at_least(64, " (below it TRL drops tool results silently)"), default=2048,
                   help="tokens per rollout, tool results included (default 2048)")
    p.add_argument("--max-tool-calls", type=_at_least(1), default=None,
                   help="tool calls per rollout (default: the job's env_server.max_steps, else 16)")
    p.add_argument("--episodes-log", default=None,
                   help="JSON lines of every episode played (default: <adapter dir>/episodes.jsonl)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when CUDA is available")
    p.add_argument("--worker", default=None, help="the worker name in events (default trace-trainer@<host>)")
    p.add_argument("--spool-dir", default=None,
                   help="--nats: where a terminal event NATS has not taken yet is kept, and sent from at the next start "
                        "(default $XDG_STATE_HOME/trace-trainer/undelivered, else ~/.local/state/trace-trainer/undelivered)")
    p.add_argument("--max-deliveries", type=_at_least(1), default=3,
                   help="--nats: a job delivered more times than this (each worker that took it died without "
                        "reporting an end) is reported failed (default 3)")
    a = p.parse_args(argv)
    missing = missing_dependencies(worker=bool(a.nats))
    if missing and a.nats:
        print(f"trace-trainer: {missing}", file=sys.stderr)
        return 2
    opts = None if missing else _options(a)

    if a.nats:
        from .worker import check_spool_dir, default_spool_dir, serve

        try:
            spool = check_spool_dir(a.spool_dir or default_spool_dir())
        except ValueError as e:
            print(f"trace-trainer: {e}", file=sys.stderr)
            return 2
        return serve(a.nats, opts, a.worker, spool, a.max_deliveries)

    try:
        with open(a.spec) as f:
            job = json.load(f)
        check_job(job)
    except (OSError, ValueError) as e:
        print(f"trace-trainer: {a.spec}: {e}", file=sys.stderr)
        return 2
    # Anything a library prints on stdout would break the event stream: the
    # events go to the real stdout, everything else to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def sink(_subject, data):
        out.write(data.decode() + "\n")
        out.flush()

    if missing:
        # The job is readable: fail it with the fix rather than a traceback.
        print(f"trace-trainer: {missing}", file=sys.stderr)
        Emitter(job, sink, a.worker).emit("failed", reason=missing[:2000])
        return 1
    return 0 if run_job(job, Emitter(job, sink, a.worker), opts) else 1


if __name__ == "__main__":
    sys.exit(main())
