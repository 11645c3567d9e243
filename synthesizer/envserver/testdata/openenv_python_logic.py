"""The environment logic of openenv_python_server.py alone, per step, for
BenchmarkEnvServer: the same episodes as the benchmark plays (reset, the
user and reservation lookups, the final answer), without any server.
Prints two lines "NAME MICROSECONDS" (CPU time per step)."""

import json
import os
import re
import sys
import time

sys.argv = [sys.argv[0], "0"]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openenv_python_server as m  # noqa: E402

N = 2000
env = m.AirlineEnvironment()
t0 = time.process_time()
for i in range(N):
    o = env.reset(seed=i)
    user = o.messages[1]["content"]
    u = re.search(r"user id ([a-z]+_[a-z]+_[0-9]+)", user).group(1)
    r = re.search(r"reservation ([A-Z0-9]{6})", user).group(1)
    env.step(m.ChatAction(tool_calls=[{"id": "1", "type": "function", "function": {"name": "get_user_details", "arguments": json.dumps({"user_id": u})}}]))
    env.step(m.ChatAction(tool_calls=[{"id": "2", "type": "function", "function": {"name": "get_reservation_details", "arguments": json.dumps({"reservation_id": r})}}]))
    env.step(m.ChatAction(content="I cannot do that."))
print("environment %.1f" % ((time.process_time() - t0) / N / 3 * 1e6))
t0 = time.process_time()
for i in range(N):
    user, st = m.make_instance(i)
    u = re.search(r"user id ([a-z]+_[a-z]+_[0-9]+)", user).group(1)
    r = re.search(r"reservation ([A-Z0-9]{6})", user).group(1)
    m.tool_step(st, "get_user_details", {"user_id": u})
    m.tool_step(st, "get_reservation_details", {"reservation_id": r})
    st["final"] = "I cannot do that."
    m.reward(st)
print("logic %.1f" % ((time.process_time() - t0) / N / 3 * 1e6))
