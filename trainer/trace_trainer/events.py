"""training_event/v1 (schemas/training_event.v1.schema.json): what a
trainer reports about a job. An Emitter numbers the events (seq), stamps
them, hands them to a sink (a line on stdout, or a NATS publish) and sends
a heartbeat whenever the job has been quiet for heartbeat_seconds."""

import datetime
import json
import socket
import sys
import threading

SCHEMA = "training_event/v1"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class Emitter:
    """emit(type, **fields) builds one event and passes it, encoded, to
    sink(subject, data). Thread-safe: training runs in one thread, the
    heartbeat in another."""

    def __init__(self, job: dict, sink, worker: str | None = None, seq_start: int = 0):
        self.job_id = job["job_id"]
        self.subject = job["report"]["events_subject"]
        self.heartbeat_seconds = max(1, int(job["report"].get("heartbeat_seconds", 30)))
        self.worker = worker or "trace-trainer@" + socket.gethostname()
        self._sink = sink
        self._seq = seq_start  # a redelivered job's worker numbers on past the earlier ones
        self._lock = threading.Lock()
        self._last = 0.0
        self._done = False  # the terminal event was sent
        self._stop = threading.Event()
        self._hb = None
        self.events = []  # every event sent, for the caller's own report

    def emit(self, type_: str, **fields) -> dict | None:
        """Sends one event; after the terminal one (succeeded, failed) none
        is sent (returns None): a heartbeat that waited for the lock while
        the terminal event was being delivered is dropped."""
        with self._lock:
            if self._done:
                return None
            ev = {"schema": SCHEMA, "job_id": self.job_id, "type": type_, "at": now_rfc3339(),
                  "seq": self._seq, "worker": self.worker}
            ev.update({k: v for k, v in fields.items() if v is not None})
            self._seq += 1
            self._done = type_ in ("succeeded", "failed")
            self._sink(self.subject, json.dumps(ev, separators=(",", ":")).encode())
            self.events.append(ev)
            self._last = _monotonic()
            return ev

    def start_heartbeat(self):
        def run():
            while not self._stop.wait(1.0):
                if _monotonic() - self._last >= self.heartbeat_seconds:
                    try:
                        self.emit("heartbeat")
                    except Exception as e:  # a lost heartbeat is not fatal; the next event may get through
                        print(f"trace-trainer: heartbeat: {e}", file=sys.stderr)

        self._last = _monotonic()
        self._hb = threading.Thread(target=run, name="heartbeat", daemon=True)
        self._hb.start()

    def stop_heartbeat(self):
        self._stop.set()
        if self._hb is not None:
            self._hb.join()


def _monotonic() -> float:
    import time

    return time.monotonic()


def stdout_sink(_subject: str, data: bytes):
    """The command protocol: one JSON object per line on stdout (logs go to
    stderr)."""
    sys.stdout.write(data.decode() + "\n")
    sys.stdout.flush()
