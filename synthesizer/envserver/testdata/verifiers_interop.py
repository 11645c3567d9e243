"""Plays trace's environment server through verifiers 0.4.0's OpenEnv
integration (verifiers.v1.tasksets.openenv: OpenEnvTaskset and
OpenEnvEnv.run), run by TestVerifiersInterop.

Two things are not verifiers' own here, and the output says so:
  - the player is scripted (it replies with the reference actions the Go
    side passes in, as JSON, one per turn) instead of a model: no GPU and
    no model server are involved;
  - verifiers 0.4.0 reads GenericEnvClient._base_url, an attribute that
    openenv-core 0.3.0 (the newest on PyPI) does not have; without it
    OpenEnvEnv.run fails with AttributeError before it sends anything. The
    script adds the attribute (the client's URL without /ws) when it is
    missing and reports that it did.

Input (argv[1], JSON): base_url, seed, actions. Output: one JSON line.
"""

import asyncio
import contextlib
import json
import sys

from openenv.core.generic_client import GenericEnvClient

patched = False
if not hasattr(GenericEnvClient, "_base_url"):
    GenericEnvClient._base_url = property(lambda self: self._ws_url[: -len("/ws")])
    patched = True

from verifiers.v1.tasksets.openenv import OpenEnvConfig, OpenEnvEnv, OpenEnvTaskset  # noqa: E402


class Segment:
    def __init__(self, reply):
        self.terminated = reply is None
        self.last_reply = reply or ""


class Trace:
    def __init__(self):
        self.rewards = {}
        self.stopped = None

    def stop(self, reason):
        self.stopped = reason

    def record_reward(self, name, value):
        self.rewards[name] = value


class ScriptedInteraction:
    """What OpenEnvEnv.run needs of an interaction: turn(payload) gives the
    player's next reply; the trace takes the reward."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.payloads = []
        self.trace = Trace()

    async def turn(self, payload):
        self.payloads.append(json.loads(payload))
        return Segment(self.replies.pop(0) if self.replies else None)


class ScriptedPlayer:
    def __init__(self, replies):
        self.last = ScriptedInteraction(replies)

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield self.last


class Agents:
    def __init__(self, player):
        self.player = player


def main():
    cfg = json.loads(open(sys.argv[1]).read())
    taskset = OpenEnvTaskset(OpenEnvConfig(base_url=cfg["base_url"], resets=[{"seed": cfg["seed"]}]))
    tasks = list(taskset.load())
    player = ScriptedPlayer(json.dumps(a) for a in cfg["actions"])
    # run() uses nothing of the env instance itself.
    asyncio.run(OpenEnvEnv.run(None, tasks[0], Agents(player)))
    it = player.last
    first = it.payloads[0]
    print(json.dumps({
        "patched_base_url": patched,
        "tasks": len(tasks),
        "turns": len(it.payloads),
        "first_user": first["observation"]["messages"][1]["content"],
        "action_schema_title": first["action_schema"].get("title"),
        "last_tool_results": [p["observation"]["last_tool_result"] for p in it.payloads[1:]],
        "rewards": it.trace.rewards,
        "stopped": it.trace.stopped,
    }))


if __name__ == "__main__":
    main()
