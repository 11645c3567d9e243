"""The nats protocol: a worker taking training jobs from the JetStream work
queue trace.training.jobs (stream TRACE_TRAINING_JOBS, durable pull
consumer trace-trainers, shared by every worker: one worker per job) and
publishing its events on the job's events subject
(trace.training.events.<job_id>). A job is acknowledged when taken (the
work queue drops it; trace's deadline fails a job whose worker dies), run
in a thread, its events published from that thread through the event
loop. SIGTERM stops taking jobs; a running job stops after its current
step and is reported failed."""

import asyncio
import json
import signal
import sys

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from . import train
from .events import Emitter

STREAM = "TRACE_TRAINING_JOBS"
SUBJECT = "trace.training.jobs"
DURABLE = "trace-trainers"


async def _serve(url: str, opts: train.Options, worker: str | None) -> int:
    nc = await nats.connect(url, name="trace-trainer")
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, lambda: (stopping.set(), train.stop_requested.set()))
    # The same consumer settings as trace's bus (internal/bus/training.go).
    sub = await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=STREAM,
                                  config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1, ack_wait=300))
    print(f"trace-trainer: waiting for jobs on {SUBJECT} ({url})", file=sys.stderr)
    try:
        while not stopping.is_set():
            try:
                msgs = await sub.fetch(1, timeout=1)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            for m in msgs:
                job = None
                try:
                    job = json.loads(m.data)
                    from .__main__ import check_job

                    check_job(job)
                except ValueError as e:
                    print(f"trace-trainer: bad job, terminated: {e}", file=sys.stderr)
                    await m.term()
                    await _report_bad_job(js, job, worker, e)
                    continue
                await m.ack()
                print(f"trace-trainer: job {job['job_id']}", file=sys.stderr)

                def sink(subject, data):
                    asyncio.run_coroutine_threadsafe(js.publish(subject, data), loop).result(timeout=30)

                from .__main__ import run_job

                ok = await asyncio.to_thread(run_job, job, Emitter(job, sink, worker), opts)
                print(f"trace-trainer: job {job['job_id']} {'succeeded' if ok else 'failed'}", file=sys.stderr)
    finally:
        await nc.drain()
    return 0


async def _report_bad_job(js, job, worker: str | None, err: Exception):
    """Reports a job this worker cannot run as failed, when it names its job
    and events subject, so that trace fails it now rather than at its
    deadline; a job that names neither can only be logged."""
    if not isinstance(job, dict) or not isinstance(job.get("job_id"), str) or not isinstance(job.get("report"), dict):
        return
    if job["report"].get("events_subject") != "trace.training.events." + job["job_id"]:
        return
    sent = []
    try:
        Emitter(job, lambda subject, data: sent.append((subject, data)), worker).emit(
            "failed", reason=f"the trainer cannot run this job: {err}"[:2000])
        for subject, data in sent:
            await js.publish(subject, data)
    except Exception as e:  # the deadline still fails the job
        print(f"trace-trainer: reporting the bad job {job['job_id']}: {e}", file=sys.stderr)


def serve(url: str, opts: train.Options, worker: str | None) -> int:
    return asyncio.run(_serve(url, opts, worker))
