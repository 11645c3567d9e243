"""openenv-core's own server (create_app) with an Environment subclass of
the same logic as synthesizer/examples/precondition_airline.star: the
baseline of the environment server benchmark (bench_test.go).

The logic is a line-by-line port of the Starlark program (seeded records,
tools, policy checks, reward); the random draws come from Python's
random.Random, so a seed gives another instance than the Starlark program's
(the benchmark plays the same kind of episode on both: reset, lookups,
the final answer). Observations have the same fields as trace's server's.

    python openenv_python_server.py PORT
"""

import json
import os
import random
import re
import sys
import uuid
from typing import Any, Dict, List, Optional

import uvicorn
from pydantic import ConfigDict, Field

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

FIRST = ["mia", "noah", "olivia", "liam", "emma", "ava", "lucas", "sofia", "ethan", "isabella", "yusuf", "chen", "amara", "mateo", "priya", "omar"]
LAST = ["kim", "garcia", "smith", "nguyen", "muller", "rossi", "khan", "silva", "cohen", "ito", "okafor", "lopez"]
AIRPORTS = ["ATL", "BOS", "DEN", "DFW", "EWR", "IAH", "JFK", "LAS", "LAX", "MIA", "ORD", "PHL", "PHX", "SEA", "SFO"]
CABINS = ["basic_economy", "economy", "business"]
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
FREE_BAGS = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 4},
}
BAG_FEE = 50
DAY_BEFORE = "2024-05-14 15:00:00"
# The policy text is the Starlark program's own (read from it), so that
# both servers send observations of the same size.
_STAR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "precondition_airline.star")
POLICY = re.search(r'POLICY = """(.*?)"""', open(_STAR).read(), re.S).group(1)

TOOLS = [
    {"type": "function", "function": {"name": "get_user_details", "description": "Get the details of a user, including their reservations.",
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}}},
    {"type": "function", "function": {"name": "get_reservation_details", "description": "Get the details of a reservation.",
        "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}},
    {"type": "function", "function": {"name": "cancel_reservation", "description": "Cancel the whole reservation.",
        "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}, "required": ["reservation_id"]}}},
    {"type": "function", "function": {"name": "update_reservation_baggages", "description": "Update the baggage information of a reservation.",
        "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}, "total_baggages": {"type": "integer"},
            "nonfree_baggages": {"type": "integer"}, "payment_id": {"type": "string"}},
            "required": ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"]}}},
]
MUTATING = ["cancel_reservation", "update_reservation_baggages"]
REFUSALS = ["cannot", "can't", "can not", "unable", "not able", "not eligible", "not allowed", "won't be able"]


def _z(n, width):
    return str(n).zfill(width)


def _dob(r):
    return "19" + _z(r.randint(50, 99), 2) + "-" + _z(r.randint(1, 12), 2) + "-" + _z(r.randint(1, 28), 2)


def _time(r, day, lo, hi):
    return "2024-05-" + _z(day, 2) + " " + _z(r.randint(lo, hi), 2) + ":" + _z(r.randint(0, 59), 2) + ":00"


def _id(r, n):
    return "".join(LETTERS[r.randint(0, len(LETTERS) - 1)] for _ in range(n))


def _reservation(r, uid, name, rid):
    origin, destination = r.sample(AIRPORTS, 2)
    npass = r.randint(1, 3)
    passengers = [{"first_name": name[0].capitalize(), "last_name": name[1].capitalize(), "dob": _dob(r)}]
    for _ in range(npass - 1):
        passengers.append({"first_name": r.choice(FIRST).capitalize(), "last_name": r.choice(LAST).capitalize(), "dob": _dob(r)})
    return {
        "reservation_id": rid, "user_id": uid, "origin": origin, "destination": destination, "flight_type": "one_way",
        "cabin": r.choice(CABINS),
        "flights": [{"flight_number": "HAT" + _z(r.randint(1, 299), 3), "date": "2024-05-" + _z(r.randint(16, 30), 2),
                     "origin": origin, "destination": destination, "price": r.randint(80, 900)}],
        "passengers": passengers, "payment_history": [], "created_at": _time(r, r.randint(1, 14), 0, 23),
        "total_baggages": r.randint(0, npass), "nonfree_baggages": 0, "insurance": r.choice(["yes", "no"]), "status": "active",
    }


def _free(user, res):
    return FREE_BAGS[user["membership"]][res["cabin"]] * len(res["passengers"])


def _allowed(user, res, task):
    if res["status"] == "cancelled":
        return False
    if task["kind"] == "cancel":
        return res["created_at"] >= DAY_BEFORE or res["cabin"] == "business" or (res["insurance"] == "yes" and task["reason"] in ["health", "weather"])
    return user["payment_methods"].get(task["payment_id"], {}).get("source") in ["credit_card", "gift_card"]


def make_instance(seed):
    r = random.Random(seed)
    name = [r.choice(FIRST), r.choice(LAST)]
    uid = "%s_%s_%d" % (name[0], name[1], r.randint(100, 999))
    digits = _z(r.randint(0, 9999999), 7)
    payments = {
        "credit_card_" + digits: {"source": "credit_card", "id": "credit_card_" + digits, "brand": r.choice(["visa", "mastercard"]), "last_four": digits[3:]},
        "gift_card_" + digits: {"source": "gift_card", "id": "gift_card_" + digits, "amount": r.randint(20, 300)},
        "certificate_" + digits: {"source": "certificate", "id": "certificate_" + digits, "amount": r.choice([100, 150, 250])},
    }
    rids = []
    n = r.randint(2, 4)
    while len(rids) < n:
        rid = _id(r, 6)
        if rid not in rids:
            rids.append(rid)
    user = {"user_id": uid, "name": {"first_name": name[0].capitalize(), "last_name": name[1].capitalize()},
            "email": "%s.%s%d@example.com" % (name[0], name[1], r.randint(1, 99)),
            "membership": r.choice(["regular", "silver", "gold"]), "payment_methods": payments, "reservations": rids}
    reservations = {}
    for rid in rids:
        res = _reservation(r, uid, name, rid)
        res["nonfree_baggages"] = max(0, res["total_baggages"] - _free(user, res))
        reservations[rid] = res
    target = reservations[rids[r.randint(0, len(rids) - 1)]]
    allowed = r.random() < 0.5
    task = {"rid": target["reservation_id"], "uid": uid}
    if r.random() < 0.5:
        task["kind"] = "cancel"
        reason = r.choice(["health", "weather", "change of plan", "found a cheaper flight"])
        target["created_at"] = _time(r, r.randint(1, 13), 0, 23)
        if target["cabin"] == "business":
            target["cabin"] = r.choice(["basic_economy", "economy"])
        if allowed:
            way = r.choice(["recent", "business", "insured"])
            if way == "recent":
                target["created_at"] = _time(r, 14, 15, 23) if r.random() < 0.5 else _time(r, 15, 0, 14)
            elif way == "business":
                target["cabin"] = "business"
            else:
                target["insurance"] = "yes"
                reason = r.choice(["health", "weather"])
        elif reason in ["health", "weather"]:
            target["insurance"] = "no"
        claim = r.choice(["I booked it just yesterday.", "I have travel insurance on it.", "It's a business class ticket.", "", ""])
        if claim == "" and not allowed and r.random() < 0.5:
            target["status"] = "cancelled"
        task["reason"] = reason
        user_msg = "Hi, I'm %s %s (user id %s). I need to cancel my reservation %s because of %s. %s" % (
            name[0].capitalize(), name[1].capitalize(), uid, target["reservation_id"], reason, claim)
    else:
        task["kind"] = "bags"
        add = r.randint(1, 3)
        pay = "credit_card_" + digits if r.random() < 0.5 else "gift_card_" + digits
        if not allowed:
            if r.random() < 0.5:
                pay = "certificate_" + digits
            else:
                target["status"] = "cancelled"
        total = target["total_baggages"] + add
        task.update({"add": add, "payment_id": pay, "total": total, "nonfree": max(0, total - _free(user, target))})
        user_msg = "Hello, this is %s %s, user id %s. Please add %d checked bag%s to reservation %s and charge it to %s." % (
            name[0].capitalize(), name[1].capitalize(), uid, add, "s" if add > 1 else "", target["reservation_id"], pay)
    task["allowed"] = _allowed(user, target, task)
    expected = {rid: [res["status"], res["total_baggages"], res["nonfree_baggages"]] for rid, res in reservations.items()}
    if task["allowed"] and task["kind"] == "cancel":
        expected[task["rid"]] = ["cancelled", target["total_baggages"], target["nonfree_baggages"]]
    elif task["allowed"]:
        expected[task["rid"]] = ["active", task["total"], task["nonfree"]]
    task["expected"] = expected
    return user_msg.strip(), {"users": {uid: user}, "reservations": reservations, "task": task, "log": [], "final": None}


def tool_step(state, name, args):
    state["log"].append({"name": name, "arguments": args})
    if name == "get_user_details":
        user = state["users"].get(args.get("user_id")) if isinstance(args.get("user_id"), str) else None
        return "Error: user not found" if user is None else user
    rid = args.get("reservation_id")
    res = state["reservations"].get(rid) if isinstance(rid, str) else None
    if res is None:
        return "Error: reservation not found"
    if name == "get_reservation_details":
        return res
    if name == "cancel_reservation":
        if res["status"] == "cancelled":
            return "Error: reservation is already cancelled"
        res["status"] = "cancelled"
        return res
    total, nonfree, pay = args.get("total_baggages"), args.get("nonfree_baggages"), args.get("payment_id")
    if not isinstance(total, int) or not isinstance(nonfree, int) or total < 0 or nonfree < 0 or nonfree > total:
        return "Error: total_baggages and nonfree_baggages must be integers with 0 <= nonfree_baggages <= total_baggages"
    user = state["users"][res["user_id"]]
    if not isinstance(pay, str) or pay not in user["payment_methods"]:
        return "Error: payment method not found"
    if total < res["total_baggages"]:
        return "Error: checked bags cannot be removed"
    fee = BAG_FEE * max(0, nonfree - res["nonfree_baggages"])
    res["total_baggages"], res["nonfree_baggages"] = total, nonfree
    if fee > 0:
        res["payment_history"].append({"payment_id": pay, "amount": fee})
    return res


def reward(state):
    task = state["task"]
    now = {rid: [res["status"], res["total_baggages"], res["nonfree_baggages"]] for rid, res in state["reservations"].items()}
    need = {"get_reservation_details": task["rid"]}
    if task["kind"] == "bags":
        need["get_user_details"] = task["uid"]
    for entry in state["log"]:
        if entry["name"] in MUTATING:
            break
        key = "user_id" if entry["name"] == "get_user_details" else "reservation_id"
        if need.get(entry["name"]) == entry["arguments"].get(key):
            need.pop(entry["name"])
    verified = len(need) == 0
    action = 1.0 if verified and now == task["expected"] else 0.0
    text = (state["final"] or "").lower()
    refused = any(w in text for w in REFUSALS)
    if task["allowed"]:
        word = "cancel" if task["kind"] == "cancel" else "bag"
        communication = 1.0 if word in text and task["rid"].lower() in text and not refused else 0.0
    else:
        communication = 1.0 if refused else 0.0
    return round(0.6 * action + 0.4 * communication, 12), {"action": action, "communication": communication, "verified": 1.0 if verified else 0.0}


class ChatAction(Action):
    """The policy's assistant message (OpenAI format)."""
    model_config = ConfigDict(extra="allow")
    role: str = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None


class ChatObservation(Observation):
    episode_id: str = ""
    seed: int = 0
    step_count: int = 0
    messages: List[Dict[str, Any]] = Field(default_factory=list)
    tools: List[Dict[str, Any]] = Field(default_factory=list)
    tool_results: List[Dict[str, Any]] = Field(default_factory=list)
    last_tool_result: Optional[str] = None
    reward_components: Optional[Dict[str, float]] = None
    done_reason: Optional[str] = None


class AirlineEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State()
        self._messages = []
        self._data = None
        self._seed = 0
        self._done = False

    def _obs(self, results, reward=None, components=None, reason=None):
        return ChatObservation(episode_id=self._state.episode_id or "", seed=self._seed, step_count=self._state.step_count,
                               messages=list(self._messages), tools=TOOLS, tool_results=results,
                               last_tool_result=results[-1]["content"] if results else None,
                               reward_components=components, done_reason=reason, done=self._done, reward=reward)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._seed = seed if seed is not None else random.randrange(1 << 31)
        user, self._data = make_instance(self._seed)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        self._messages = [{"role": "system", "content": POLICY}, {"role": "user", "content": user}]
        self._done = False
        return self._obs([])

    def step(self, action, timeout_s=None, **kwargs):
        if self._data is None or self._done:
            raise RuntimeError("send reset first")
        calls = action.tool_calls or []
        msg = {"role": "assistant", "content": action.content or ""}
        if calls:
            msg["tool_calls"] = calls
        self._messages.append(msg)
        self._state.step_count += 1
        results = []
        for c in calls:
            args = c["function"].get("arguments") or "{}"
            args = json.loads(args) if isinstance(args, str) else args
            out = tool_step(self._data, c["function"]["name"], args)
            content = out if isinstance(out, str) else json.dumps(out, sort_keys=True, separators=(",", ":"))
            results.append({"role": "tool", "content": content, "tool_call_id": c.get("id", "")})
        self._messages.extend(results)
        if calls:
            return self._obs(results)
        self._data["final"] = action.content or ""
        self._done = True
        value, components = reward(self._data)
        return self._obs(results, reward=value, components=components, reason="final")

    @property
    def state(self):
        return self._state


app = create_app(AirlineEnvironment, ChatAction, ChatObservation, max_concurrent_envs=128)

if __name__ == "__main__":
    # argv[2] "standard": uvicorn[standard]'s event loop and HTTP parser
    # (uvloop, httptools), as a deployment that installs the extra runs;
    # otherwise asyncio and h11, what `pip install openenv-core` gives
    # (uvicorn without extras), named so that an extra installed in the
    # venv does not change the baseline.
    standard = len(sys.argv) > 2 and sys.argv[2] == "standard"
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                loop="uvloop" if standard else "asyncio", http="httptools" if standard else "h11")
