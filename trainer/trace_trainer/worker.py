"""The nats protocol: a worker taking training jobs from the JetStream work
queue trace.training.jobs (stream TRACE_TRAINING_JOBS, durable pull
consumer trace-trainers, shared by every worker: one worker per job) and
publishing its events on the job's events subject
(trace.training.events.<job_id>). A job is acknowledged when its
terminal event is published, not when it is taken: while it trains, the
worker sends in-progress acks every third of the consumer's ack wait, so
a worker that dies (killed, out of memory, preempted) leaves the job to
be redelivered to another worker one ack wait later. That worker numbers
its events from (deliveries - 1) x SEQ_STRIDE, so that they are not taken
for the earlier worker's (a repeated seq is one event for trace). A job
delivered more than max_deliveries times is reported failed and
terminated (it killed every worker that took it); a job whose events
subject already ends with a terminal event (trace failed it past its
deadline, it was cancelled, or a worker's ack was lost after it
finished) is acknowledged without training. The job runs in a thread,
its events published from that thread through the event loop. SIGTERM
(or SIGINT) stops taking jobs; a running job stops after its current step
and is handed back: no terminal event, a nak (no delay), so that another
worker takes it at once and trains it from the start (its started is a new
run for trace; a hand-back counts as a delivery). A job fetched as the
worker stops is handed back untrained. A nak NATS does not take (it is
down) leaves the job to be redelivered one ack wait later, as for a
worker that died.

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
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig

from . import train
from .events import Emitter

STREAM = "TRACE_TRAINING_JOBS"
SUBJECT = "trace.training.jobs"
DURABLE = "trace-trainers"
EVENTS_STREAM = "TRACE_TRAINING_EVENTS"
TERMINAL = ("succeeded", "failed")
# The consumer's ack wait when trace's bus or this worker creates it
# (internal/bus/training.go); the worker sends in-progress acks every
# third of the ack wait of the consumer it finds.
ACK_WAIT = 300
# A redelivered job's events are numbered from (deliveries - 1) x SEQ_STRIDE.
SEQ_STRIDE = 1_000_000_000
# Jobs held un-acked at once by all the workers of the consumer (a job is
# acked when it ends, so this is how many train at once): as trace's bus
# makes the consumer (TrainerMaxAckPending, internal/bus/training.go).
MAX_ACK_PENDING = 1024
# Deliveries of one job before it is reported failed (every worker that
# took it died without an end).
MAX_DELIVERIES = 3

# Seconds one publish may wait for JetStream's acknowledgement.
PUBLISH_TIMEOUT = 30
# Seconds a stopping worker waits for the server to take its nak.
NAK_TIMEOUT = 5
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


async def _ended(js, job: dict) -> str | None:
    """The type of the terminal event the job's events subject ends with
    (the job ended: failed by trace past its deadline, cancelled, or
    finished by a worker whose ack was lost), None when it does not or
    that cannot be told (the job is trained)."""
    try:
        m = await js.get_last_msg(EVENTS_STREAM, job["report"]["events_subject"])
        t = json.loads(m.data).get("type")
    except nats.js.errors.NotFoundError:
        return None
    except Exception as e:
        _log(f"job {job['job_id']}: could not read its last event, training it: {type(e).__name__}: {e}")
        return None
    return t if t in TERMINAL else None


async def _raise_max_ack_pending(js, info):
    """Raises the existing consumer's max_ack_pending to MAX_ACK_PENDING,
    its other settings kept; on failure the consumer stays as it is, with a
    warning (jobs then train one at a time fleet-wide)."""
    was = info.config.max_ack_pending
    try:
        cfg = info.config
        cfg.max_ack_pending = MAX_ACK_PENDING
        info = await js.add_consumer(STREAM, config=cfg)
        _log(f"consumer {DURABLE}: max_ack_pending raised from {was} to {MAX_ACK_PENDING} (jobs are acked when they end)")
    except Exception as e:
        _log(f"WARNING: consumer {DURABLE} has max_ack_pending {was}, and raising it failed ({type(e).__name__}: {e}): "
             f"only {was} job(s) can train at once across all workers; raise it with "
             f"`nats consumer edit {STREAM} {DURABLE} --max-pending {MAX_ACK_PENDING}`")
    return info


async def _keep_in_progress(m, every: float, job_id: str):
    """In-progress acks for m every `every` seconds until cancelled: the
    job is not redelivered while this worker has it."""
    while True:
        await asyncio.sleep(every)
        try:
            await m.in_progress()
        except Exception as e:  # NATS is down: past the ack wait the job goes to another worker
            _log(f"job {job_id}: in-progress ack not sent: {type(e).__name__}: {e}")


async def _ack(nc, m, job_id: str, stopping: asyncio.Event):
    """Acknowledges a finished job, confirmed by the server, retrying
    while NATS is unreachable; a worker stopping gives up (the job is
    redelivered, and the next worker finds its terminal event)."""
    delay = RETRY_INITIAL
    while True:
        try:
            if not nc.is_connected:
                raise nats.errors.ConnectionReconnectingError
            await m.ack_sync(timeout=PUBLISH_TIMEOUT)
            return
        except Exception as e:
            if stopping.is_set():
                _log(f"job {job_id}: not acknowledged before stopping ({type(e).__name__}: {e}); "
                     "it is redelivered, and skipped if its terminal event is stored")
                return
            _log(f"job {job_id}: ack not confirmed, retrying: {type(e).__name__}: {e}")
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        delay = min(delay * 2, RETRY_MAX)


async def _hand_back(nc, m, job_id: str, ack_wait: float):
    """Hands a job this worker will not end back to the work queue (nak, no
    delay: another worker takes it at once), waiting for the server to have
    it; when NATS cannot take it the job is redelivered after the ack wait
    anyway."""
    try:
        if not nc.is_connected:
            raise nats.errors.ConnectionReconnectingError
        await m.nak()
        await nc.flush(timeout=NAK_TIMEOUT)
    except Exception as e:
        _log(f"job {job_id}: hand-back (nak) not delivered ({type(e).__name__}: {e}); "
             f"it is redelivered to another worker after the ack wait ({ack_wait:g} s)")
        return
    _log(f"job {job_id}: handed back (nak) for another worker")


async def _serve(url: str, opts: train.Options, worker: str | None, spool_dir: str,
                 max_deliveries: int = MAX_DELIVERIES) -> int:
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
                                      config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=MAX_ACK_PENDING,
                                                            ack_wait=ACK_WAIT))
        info = await sub.consumer_info()
        if (info.config.max_ack_pending or 0) < MAX_ACK_PENDING:
            # Made by an older worker, which acked a job when it took it:
            # its limit (1) would let one job train at a time fleet-wide.
            info = await _raise_max_ack_pending(js, info)
        ack_wait = info.config.ack_wait or ACK_WAIT
        every = max(ack_wait / 3, 0.1)
        _log(f"waiting for jobs on {SUBJECT} ({url}); in-progress acks every {every:g} s (ack wait {ack_wait:g} s)")
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
                jid = job["job_id"]
                ended = await _ended(js, job)
                if ended:
                    _log(f"job {jid} already ended ({ended} event stored): acknowledged without training")
                    await _ack(nc, m, jid, stopping)
                    continue
                deliveries = m.metadata.num_delivered
                if deliveries > max_deliveries:
                    _log(f"job {jid} delivered {deliveries} times: reported failed and terminated")
                    await m.term()
                    await _report_bad_job(js, job, worker, RuntimeError(
                        f"the job was delivered {deliveries} times (more than {max_deliveries}): each worker that took it "
                        "stopped without reporting an end (killed, out of memory, preempted, stopped by SIGTERM and "
                        "handed it back, or NATS unreachable past the ack wait)"), seq=(deliveries - 1) * SEQ_STRIDE,
                        prefix="")
                    continue
                if stopping.is_set():
                    _log(f"job {jid} fetched as this worker stops: not trained")
                    await _hand_back(nc, m, jid, ack_wait)
                    continue
                _log(f"job {jid}" + (f" (delivery {deliveries}: an earlier worker stopped without reporting an end)"
                                     if deliveries > 1 else ""))
                from .__main__ import HANDED_BACK, run_job

                pub.begin()
                keep = asyncio.create_task(_keep_in_progress(m, every, jid))
                try:
                    ok = await asyncio.to_thread(run_job, job, Emitter(job, pub.send, worker, (deliveries - 1) * SEQ_STRIDE),
                                                 opts, hand_back=True)
                finally:
                    keep.cancel()
                if ok == HANDED_BACK:
                    _log(f"job {jid} stopped by this worker's stop request (SIGTERM) before its end: no terminal event")
                    await _hand_back(nc, m, jid, ack_wait)
                    continue
                _log(f"job {jid} {'succeeded' if ok else 'failed'}")
                await _ack(nc, m, jid, stopping)
    finally:
        try:
            if sub is not None:
                # Draining a pull subscription waits out drain_timeout (30 s):
                # its queue is never marked done.
                await sub.unsubscribe()
            await nc.drain()
        except Exception:
            try:
                await nc.close()
            except Exception as e:  # NATS is down: nothing left to flush to
                _log(f"closing the NATS connection: {type(e).__name__}: {e}")
    return 0


async def _report_bad_job(js, job, worker: str | None, err: Exception, seq: int = 0,
                          prefix: str = "the trainer cannot run this job: "):
    """Reports a job this worker cannot run as failed, when it names its job
    and events subject, so that trace fails it now rather than at its
    deadline; a job that names neither can only be logged."""
    if not isinstance(job, dict) or not isinstance(job.get("job_id"), str) or not isinstance(job.get("report"), dict):
        return
    if job["report"].get("events_subject") != "trace.training.events." + job["job_id"]:
        return
    sent = []
    try:
        Emitter(job, lambda subject, data: sent.append((subject, data)), worker, seq).emit(
            "failed", reason=f"{prefix}{err}"[:2000])
        for subject, data in sent:
            await js.publish(subject, data)
    except Exception as e:  # the deadline still fails the job
        _log(f"reporting the bad job {job['job_id']}: {e}")


def serve(url: str, opts: train.Options, worker: str | None, spool_dir: str | None = None,
          max_deliveries: int = MAX_DELIVERIES) -> int:
    return asyncio.run(_serve(url, opts, worker, check_spool_dir(spool_dir or default_spool_dir()), max_deliveries))
