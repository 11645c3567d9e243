"""The example environment (synthesizer/examples/precondition_airline.star)
as a plain Python class in the style of the TRACE authors' environments, for
the benchmark BenchmarkExampleVersusCPython: same records, same policy, same
reward, with Python's own random module for the draws.

Run: python3 precondition_airline.py EPISODES LOOKUPS
  -> prints "steps N seconds S cpu_seconds C step_seconds S2 step_cpu_seconds C2":
     wall-clock and CPU time of the whole loop, and of the step loops only
Each episode is a reset, LOOKUPS repetitions of the reference solution's
look-up calls, the reference solution itself, and the reward.
"""
import json
import random
import sys
import time

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
POLICY = "You are an airline customer service agent. (The policy text of the Starlark version.)"
MUTATING = ["cancel_reservation", "update_reservation_baggages"]
REFUSALS = ["cannot", "can't", "can not", "unable", "not able", "not eligible", "not allowed", "won't be able"]


def _time(r, day, lo, hi):
    return "2024-05-%02d %02d:%02d:00" % (day, r.randint(lo, hi), r.randint(0, 59))


class PreconditionAirlineEnv:
    def reset(self, seed):
        r = random.Random(seed)
        name = [r.choice(FIRST), r.choice(LAST)]
        uid = "%s_%s_%d" % (name[0], name[1], r.randint(100, 999))
        digits = "%07d" % r.randint(0, 9999999)
        payments = {
            "credit_card_" + digits: {"source": "credit_card", "id": "credit_card_" + digits, "brand": r.choice(["visa", "mastercard"]), "last_four": digits[3:]},
            "gift_card_" + digits: {"source": "gift_card", "id": "gift_card_" + digits, "amount": r.randint(20, 300)},
            "certificate_" + digits: {"source": "certificate", "id": "certificate_" + digits, "amount": r.choice([100, 150, 250])},
        }
        rids = []
        n = r.randint(2, 4)
        while len(rids) < n:
            rid = "".join(LETTERS[r.randint(0, len(LETTERS) - 1)] for _ in range(6))
            if rid not in rids:
                rids.append(rid)
        user = {"user_id": uid, "name": {"first_name": name[0].capitalize(), "last_name": name[1].capitalize()},
                "email": "%s.%s%d@example.com" % (name[0], name[1], r.randint(1, 99)),
                "membership": r.choice(["regular", "silver", "gold"]), "payment_methods": payments, "reservations": rids}
        reservations = {}
        for rid in rids:
            res = self._reservation(r, uid, name, rid)
            res["nonfree_baggages"] = max(0, res["total_baggages"] - self._free(user, res))
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
            free = self._free(user, target)
            total = target["total_baggages"] + add
            task.update(add=add, payment_id=pay, total=total, nonfree=max(0, total - free))
            user_msg = "Hello, this is %s %s, user id %s. Please add %d checked bag%s to reservation %s and charge it to %s." % (
                name[0].capitalize(), name[1].capitalize(), uid, add, "s" if add > 1 else "", target["reservation_id"], pay)
        task["allowed"] = self._allowed(user, target, task)
        snapshot = {rid: [res["status"], res["total_baggages"], res["nonfree_baggages"]] for rid, res in reservations.items()}
        expected = dict(snapshot)
        if task["allowed"] and task["kind"] == "cancel":
            expected[task["rid"]] = ["cancelled", target["total_baggages"], target["nonfree_baggages"]]
        elif task["allowed"]:
            expected[task["rid"]] = ["active", task["total"], task["nonfree"]]
        task["expected"] = expected
        self.users = {uid: user}
        self.reservations = reservations
        self.task = task
        self.log = []
        self.final = None
        return POLICY, user_msg.strip()

    def _reservation(self, r, uid, name, rid):
        origin, destination = r.sample(AIRPORTS, 2)
        npass = r.randint(1, 3)
        dob = lambda: "19%02d-%02d-%02d" % (r.randint(50, 99), r.randint(1, 12), r.randint(1, 28))
        passengers = [{"first_name": name[0].capitalize(), "last_name": name[1].capitalize(), "dob": dob()}]
        for _ in range(npass - 1):
            passengers.append({"first_name": r.choice(FIRST).capitalize(), "last_name": r.choice(LAST).capitalize(), "dob": dob()})
        date = "2024-05-%02d" % r.randint(16, 30)
        return {"reservation_id": rid, "user_id": uid, "origin": origin, "destination": destination, "flight_type": "one_way",
                "cabin": r.choice(CABINS),
                "flights": [{"flight_number": "HAT%03d" % r.randint(1, 299), "date": date, "origin": origin, "destination": destination, "price": r.randint(80, 900)}],
                "passengers": passengers, "payment_history": [], "created_at": _time(r, r.randint(1, 14), 0, 23),
                "total_baggages": r.randint(0, npass), "nonfree_baggages": 0, "insurance": r.choice(["yes", "no"]), "status": "active"}

    @staticmethod
    def _free(user, res):
        return FREE_BAGS[user["membership"]][res["cabin"]] * len(res["passengers"])

    @staticmethod
    def _allowed(user, res, task):
        if res["status"] == "cancelled":
            return False
        if task["kind"] == "cancel":
            return res["created_at"] >= DAY_BEFORE or res["cabin"] == "business" or (res["insurance"] == "yes" and task["reason"] in ["health", "weather"])
        return user["payment_methods"].get(task["payment_id"], {}).get("source") in ["credit_card", "gift_card"]

    # The tools.
    def get_user_details(self, user_id=None):
        user = self.users.get(user_id) if isinstance(user_id, str) else None
        return user if user is not None else "Error: user not found"

    def _res(self, reservation_id):
        return self.reservations.get(reservation_id) if isinstance(reservation_id, str) else None

    def get_reservation_details(self, reservation_id=None):
        res = self._res(reservation_id)
        return res if res is not None else "Error: reservation not found"

    def cancel_reservation(self, reservation_id=None):
        res = self._res(reservation_id)
        if res is None:
            return "Error: reservation not found"
        if res["status"] == "cancelled":
            return "Error: reservation is already cancelled"
        res["status"] = "cancelled"
        return res

    def update_reservation_baggages(self, reservation_id=None, total_baggages=None, nonfree_baggages=None, payment_id=None):
        res = self._res(reservation_id)
        if res is None:
            return "Error: reservation not found"
        total, nonfree, pay = total_baggages, nonfree_baggages, payment_id
        if type(total) is not int or type(nonfree) is not int or total < 0 or nonfree < 0 or nonfree > total:
            return "Error: total_baggages and nonfree_baggages must be integers with 0 <= nonfree_baggages <= total_baggages"
        user = self.users[res["user_id"]]
        if not isinstance(pay, str) or pay not in user["payment_methods"]:
            return "Error: payment method not found"
        if total < res["total_baggages"]:
            return "Error: checked bags cannot be removed"
        fee = BAG_FEE * max(0, nonfree - res["nonfree_baggages"])
        res["total_baggages"], res["nonfree_baggages"] = total, nonfree
        if fee > 0:
            res["payment_history"].append({"payment_id": pay, "amount": fee})
        return res

    TOOLS = {"get_user_details", "get_reservation_details", "cancel_reservation", "update_reservation_baggages"}

    def step(self, name, arguments):
        """One tool call as OpenAI sends it (arguments as JSON text); returns the result text."""
        try:
            args = json.loads(arguments)
        except ValueError as e:
            return "Error: the arguments of %s are not a JSON object: %s" % (name, e)
        if name not in self.TOOLS:
            return "Error: unknown tool %r" % name
        self.log.append({"name": name, "arguments": args})
        result = getattr(self, name)(**args)
        return result if isinstance(result, str) else json.dumps(result)

    def answer(self, content):
        self.final = content

    def _verified(self):
        need = {"get_reservation_details": self.task["rid"]}
        if self.task["kind"] == "bags":
            need["get_user_details"] = self.task["uid"]
        for entry in self.log:
            if entry["name"] in MUTATING:
                break
            key = "user_id" if entry["name"] == "get_user_details" else "reservation_id"
            if need.get(entry["name"]) == entry["arguments"].get(key):
                need.pop(entry["name"])
        return not need

    def reward(self):
        task = self.task
        now = {rid: [res["status"], res["total_baggages"], res["nonfree_baggages"]] for rid, res in self.reservations.items()}
        verified = self._verified()
        action = 1.0 if verified and now == task["expected"] else 0.0
        text = (self.final or "").lower()
        refused = any(w in text for w in REFUSALS)
        if task["allowed"]:
            word = "cancel" if task["kind"] == "cancel" else "bag"
            communication = 1.0 if word in text and task["rid"].lower() in text and not refused else 0.0
        else:
            communication = 1.0 if refused else 0.0
        return {"reward": 0.6 * action + 0.4 * communication, "components": {"action": action, "communication": communication, "verified": float(verified)}}

    def reference(self):
        task = self.task
        calls = []
        if task["kind"] == "bags":
            calls.append(("get_user_details", {"user_id": task["uid"]}))
        calls.append(("get_reservation_details", {"reservation_id": task["rid"]}))
        if not task["allowed"]:
            return calls, "I'm sorry, but I cannot do that for reservation %s: the policy does not allow it." % task["rid"]
        if task["kind"] == "cancel":
            calls.append(("cancel_reservation", {"reservation_id": task["rid"]}))
            return calls, "Reservation %s has been cancelled." % task["rid"]
        calls.append(("update_reservation_baggages", {"reservation_id": task["rid"], "total_baggages": task["total"], "nonfree_baggages": task["nonfree"], "payment_id": task["payment_id"]}))
        return calls, "Done: reservation %s now has %d checked bags." % (task["rid"], task["total"])


def main():
    episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    lookups = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    env = PreconditionAirlineEnv()
    # The calls of each episode are prepared outside the timed loop, as the
    # Go benchmark prepares its actions: arguments as JSON text.
    plans = []
    for seed in range(episodes):
        env.reset(seed)
        calls, final = env.reference()
        reads = [c for c in calls if c[0].startswith("get_")]
        calls = [reads[i % len(reads)] for i in range(lookups)] + calls
        plans.append((seed, [(name, json.dumps(args)) for name, args in calls], final))
    steps = 0
    total = 0.0
    step_wall = step_cpu = 0.0
    start = time.perf_counter()
    cpu = time.process_time()
    for seed, calls, final in plans:
        env.reset(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        for name, args in calls:
            env.step(name, args)
        env.answer(final)
        step_wall += time.perf_counter() - t0
        step_cpu += time.process_time() - c0
        steps += len(calls) + 1
        r = env.reward()
        total += r["reward"]
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    if total != episodes:
        sys.exit("the reference scored %s of %d" % (total, episodes))
    print("steps %d seconds %.6f cpu_seconds %.6f step_seconds %.6f step_cpu_seconds %.6f" % (steps, elapsed, cpu, step_wall, step_cpu))


if __name__ == "__main__":
    main()
