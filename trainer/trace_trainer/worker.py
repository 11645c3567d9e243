"""The nats protocol: a worker taking training jobs from the JetStream work
queue trace.training.jobs (stream TRACE_TRAINING_JOBS, durable pull
consumer trace-trainers, shared by every worker: one worker per job) and
publishing its events on the job's events subject
(trace.training.events.<job_id>). A job is acknowledged when taken (the
work queue drops it; trace's deadline fails a job whose worker dies), run
in a thread, its events published from that thread through the event
loop. SIGTERM stops taking jobs; a running job stops after its current
step and is reported failed.

A NATS outage never aborts a job (the connection reconnects for ever).
Events other than the terminal one (started, progress, heartbeat) are
best-effort: while NATS is down the latest is kept and the rest dropped,
and the kept one is sent when NATS is back. The terminal event (succeeded,
failed) is retried with exponential backoff until NATS stores it; from its
first failed attempt it is also written to the spool directory, so that a
worker stopped (or killed) before delivering it leaves it there, and the
next worker started on that spool directory sends it before taking jobs
(a repeated seq is one event for trace)."""

import asyncio
import json
import os
import random
import signal
import sys
import threading

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from . import train
from .events import Emitter

STREAM = "TRACE_TRAINING_JOBS"
SUBJECT = "trace.training.jobs"
DURABLE = "trace-trainers"
TERMINAL = ("succeeded", "failed")

# Seconds one publish may wait for JetStream's acknowledgement.
PUBLISH_TIMEOUT = 30
# The terminal event's retries: the first after RETRY_INITIAL seconds,
# doubling (with jitter) up to RETRY_MAX.
RETRY_INITIAL = 1.0
RETRY_MAX = 60.0


def default_spool_dir() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "trace-trainer", "undelivered")


def _log(msg: str):
    print(f"trace-trainer: {msg}", file=sys.stderr)


class Publisher:
    """The events' way to NATS, called from the training thread (send) with
    the event loop running in another thread. One per connection; begin()
    before each job."""

    def __init__(self, nc, js, loop, spool_dir: str, stop: threading.Event):
        self.nc, self.js, self.loop, self.spool_dir, self.stop = nc, js, loop, spool_dir, stop
        self._lock = threading.Lock()  # pending
        self._send = threading.Lock()  # one publish at a time, in order
        self._pending = None  # the latest best-effort event not delivered: (subject, data)
        self._wake = threading.Event()  # reconnected, or stopping: retry now
        self._dropped = 0

    def begin(self):
        with self._lock:
            self._pending, self._dropped = None, 0

    def wake(self):
        self._wake.set()

    def _publish(self, subject: str, data: bytes):
        fut = asyncio.run_coroutine_threadsafe(self.js.publish(subject, data, timeout=PUBLISH_TIMEOUT), self.loop)
        try:
            fut.result(timeout=PUBLISH_TIMEOUT + 1)
        except BaseException:
            fut.cancel()
            raise

    def send(self, subject: str, data: bytes):
        """The Emitter's sink. Never raises for a NATS failure."""
        if json.loads(data).get("type") in TERMINAL:
            self._terminal(subject, data)
        else:
            self._best_effort(subject, data)

    def _best_effort(self, subject: str, data: bytes):
        with self._lock:
            if self._pending is not None:
                self._dropped += 1
            self._pending = (subject, data)  # the latest wins
        if self.nc.is_connected:
            self.flush()

    def flush(self):
        """Sends the kept best-effort event, if any; keeps it (unless a newer
        one came) when that fails."""
        with self._send:
            with self._lock:
                p, self._pending = self._pending, None
            if p is None:
                return
            try:
                self._publish(*p)
            except Exception as e:
                with self._lock:
                    if self._pending is None:
                        self._pending = p
                    else:
                        self._dropped += 1
                _log(f"event not delivered, kept until NATS is back (newer ones replace it): {type(e).__name__}: {e}")
                return
            with self._lock:
                if self._dropped:
                    _log(f"NATS is back: {self._dropped} event(s) reported during the outage were replaced by later ones")
                    self._dropped = 0

    def _spool_path(self, data: bytes) -> str:
        return os.path.join(self.spool_dir, json.loads(data)["job_id"] + ".json")

    def _terminal(self, subject: str, data: bytes):
        with self._lock:
            # The terminal event supersedes a kept one, and must be last.
            dropped = self._dropped + (self._pending is not None)
            self._pending, self._dropped = None, 0
        if dropped:
            _log(f"{dropped} event(s) reported while NATS was unreachable were not delivered (superseded)")
        delay, spooled = RETRY_INITIAL, None
        while True:
            err = None
            if self.nc.is_connected:
                try:
                    with self._send:
                        self._publish(subject, data)
                except Exception as e:
                    err = f"{type(e).__name__}: {e}"
                else:
                    if spooled:
                        _remove(spooled)
                        _log(f"terminal event of {json.loads(data)['job_id']} delivered after NATS came back")
                    return
            else:
                err = "NATS is disconnected"
            if spooled is None:
                spooled = self._spool_path(data)
                _write_spool(spooled, subject, data)
                _log(f"terminal event not delivered ({err}): kept in {spooled}, retrying until NATS takes it")
            if self.stop.is_set():
                _log(f"stopping with the terminal event undelivered: it stays in {spooled}; "
                     "a worker started on that spool directory sends it")
                return
            self._wake.wait(delay * random.uniform(0.8, 1.2))
            self._wake.clear()
            delay = min(delay * 2, RETRY_MAX)

    def resend_spooled(self) -> int:
        """Sends every terminal event a previous worker left in the spool
        directory (retried like any terminal event); returns how many."""
        n = 0
        for name in sorted(os.listdir(self.spool_dir)):
            if not name.endswith(".json"):
                continue
            path = os.path.join(self.spool_dir, name)
            try:
                with open(path) as f:
                    rec = json.load(f)
                subject, data = rec["subject"], rec["event"].encode()
            except FileNotFoundError:
                continue  # another worker on this spool sent it
            except (OSError, ValueError, KeyError) as e:
                _log(f"spooled event {path} unreadable, left there: {e}")
                continue
            _log(f"sending the terminal event a previous worker left in {path}")
            self._terminal(subject, data)
            if self.stop.is_set() and os.path.exists(path):
                break
            _remove(path)
            n += 1
        return n


def _write_spool(path: str, subject: str, data: bytes):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"subject": subject, "event": data.decode()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _remove(path: str):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def check_spool_dir(path: str) -> str:
    """Creates the spool directory; raises ValueError naming --spool-dir
    when it cannot be written."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".probe")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"--spool-dir {path}: cannot write there: {e}") from e
    return path


async def _serve(url: str, opts: train.Options, worker: str | None, spool_dir: str) -> int:
    loop = asyncio.get_running_loop()
    pub = None

    async def reconnected():
        _log("NATS connection back")
        if pub is not None:
            pub.wake()
            loop.run_in_executor(None, pub.flush)

    async def disconnected():
        _log("NATS connection lost; reconnecting (a running job goes on)")

    async def error(e):
        _log(f"nats: {type(e).__name__}: {e}")

    nc = await nats.connect(url, name="trace-trainer", max_reconnect_attempts=-1, reconnected_cb=reconnected,
                            disconnected_cb=disconnected, error_cb=error)
    js = nc.jetstream()
    stopping = asyncio.Event()
    pub = Publisher(nc, js, loop, spool_dir, train.stop_requested)
    sub = None
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, lambda: (stopping.set(), train.stop_requested.set(), pub.wake()))
    try:
        if await asyncio.to_thread(pub.resend_spooled):
            _log("spooled terminal events sent")
        # The same consumer settings as trace's bus (internal/bus/training.go).
        sub = await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=STREAM,
                                      config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1, ack_wait=300))
        _log(f"waiting for jobs on {SUBJECT} ({url})")
        while not stopping.is_set():
            try:
                msgs = await sub.fetch(1, timeout=1)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            except nats.errors.Error as e:  # NATS is down: wait for it
                if not nc.is_connected:
                    await asyncio.sleep(1)
                else:
                    _log(f"fetch: {type(e).__name__}: {e}")
                    await asyncio.sleep(1)
                continue
            for m in msgs:
                job = None
                try:
                    job = json.loads(m.data)
                    from .__main__ import check_job

                    check_job(job)
                except ValueError as e:
                    _log(f"bad job, terminated: {e}")
                    await m.term()
                    await _report_bad_job(js, job, worker, e)
                    continue
                try:
                    await m.ack()
                except nats.errors.Error as e:  # not taken: the work queue redelivers it
                    _log(f"job {job['job_id']} not acknowledged, left to the queue: {type(e).__name__}: {e}")
                    continue
                _log(f"job {job['job_id']}")
                from .__main__ import run_job

                pub.begin()
                ok = await asyncio.to_thread(run_job, job, Emitter(job, pub.send, worker), opts)
                _log(f"job {job['job_id']} {'succeeded' if ok else 'failed'}")
    finally:
        try:
            if sub is not None:
                # Draining a pull subscription waits out drain_timeout (30 s):
                # its queue is never marked done.
                await sub.unsubscribe()
            await nc.drain()
        except Exception:
            await nc.close()
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
        _log(f"reporting the bad job {job['job_id']}: {e}")


def serve(url: str, opts: train.Options, worker: str | None, spool_dir: str | None = None) -> int:
    return asyncio.run(_serve(url, opts, worker, check_spool_dir(spool_dir or default_spool_dir())))
