package simulate

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/traceops/trace/schemas"
)

const airlinePolicy = `# Airline agent policy

The current time is 2024-05-15 15:00:00 EST.

As an airline customer service agent you help users book, modify and cancel flight reservations, manage baggage, and handle refunds and compensation.

## General rules
- Authenticate the user by their user id before anything else, and look the user up with get_user_details.
- Before you modify or cancel a reservation, read it with get_reservation_details and check that the change is allowed (cabin, insurance, flight status, who booked it).
- Before any action that updates the booking database (booking, changing flights or cabin, changing baggage, cancelling, sending a certificate), list the details of the action and obtain the user's explicit confirmation ("yes") to proceed.
- Only use identifiers (reservation ids, flight numbers, payment ids) that the user gave you or that a tool returned. Never make one up.
- Make one tool call at a time. Do not answer the user in the same turn as a tool call.
- If a tool returns an error, read the message, fix the call (ask the user when you need information) and try again. Transfer to a human agent only when the request cannot be handled within this policy.
- Complete every request of the user before you end the conversation.

## Baggage
Free checked bags per passenger: regular members 0 (basic economy), 1 (economy), 2 (business); silver members 1, 2, 3; gold members 2, 3, 3. Every extra bag costs $50. Bags can be added but not removed.

## Payment
Each reservation is paid with payment methods from the user's profile: credit cards, gift cards (limited by their balance) and travel certificates. A fare difference is charged to, or refunded to, one payment method of the profile.

## Compensation
If a user's flight was delayed and the user changes or cancels the reservation, you may offer a travel certificate of $50 per passenger after checking the reservation.`

var airports = []struct{ code, city string }{
	{"JFK", "New York"}, {"SEA", "Seattle"}, {"SFO", "San Francisco"}, {"ORD", "Chicago"}, {"LAX", "Los Angeles"},
	{"BOS", "Boston"}, {"PHX", "Phoenix"}, {"ATL", "Atlanta"}, {"DEN", "Denver"}, {"MIA", "Miami"},
	{"LGA", "New York"}, {"DFW", "Dallas"}, {"IAH", "Houston"}, {"LAS", "Las Vegas"}, {"DTW", "Detroit"},
	{"MSP", "Minneapolis"}, {"PHL", "Philadelphia"}, {"CLT", "Charlotte"}, {"EWR", "Newark"}, {"MCO", "Orlando"},
}

var cabins = []string{"basic_economy", "economy", "business"}

func cabinName(c string) string { return strings.ReplaceAll(c, "_", " ") }

// freeBags per passenger by membership and cabin.
func freeBags(membership, cabin string) int {
	ci := map[string]int{"basic_economy": 0, "economy": 1, "business": 2}[cabin]
	switch membership {
	case "gold":
		return []int{2, 3, 3}[ci]
	case "silver":
		return []int{1, 2, 3}[ci]
	default:
		return []int{0, 1, 2}[ci]
	}
}

type airPay struct {
	id, source, brand, last4 string
	balance                  float64
}

type airSeg struct {
	num, from, to, date, dep, arr string
	prices                        map[string]int
}

type airRes struct {
	id, userID, from, to, cabin, created string
	seg                                  airSeg
	pax                                  []person
	payID                                string
	bags, nonfree                        int
	insurance                            string
	paid                                 []obj // payment history
}

func (r *airRes) price() int { return r.seg.prices[r.cabin] }
func (r *airRes) total() int { return r.price() * len(r.pax) }

type airUser struct {
	p          person
	id, email  string
	membership string
	addr       address
	card, gift airPay
	res        []*airRes
}

type airAct struct {
	kind string // cancel | bags | change | book | cert
	res  *airRes
	// change and book
	date string
	opts []airSeg
	pick int
	// bags
	add, total, nonfree int
	// cert
	amount int
	// book: the new reservation id
	newID string
}

func (a *airAct) tool() string {
	return map[string]string{
		"cancel": "cancel_reservation", "bags": "update_reservation_baggages", "change": "update_reservation_flights",
		"book": "book_reservation", "cert": "send_certificate",
	}[a.kind]
}

// cost is what the action charges (a negative cost is a refund).
func (a *airAct) cost() int {
	switch a.kind {
	case "cancel":
		return -a.res.total()
	case "bags":
		return 50 * (a.nonfree - a.res.nonfree)
	case "change":
		return (a.opts[a.pick].prices[a.res.cabin] - a.res.price()) * len(a.res.pax)
	case "book":
		return a.opts[a.pick].prices[a.res.cabin]
	}
	return 0
}

type airTask struct {
	u       *airUser
	acts    []*airAct
	ro      string // read-only question: "baggage" | "info"
	roRes   *airRes
	payGift bool   // the user asks to pay with a gift card whose balance is too low (tool error)
	typoID  string // the mistyped user id (lookup error)
}

type airline struct{}

func newAirline(uint64) *airline { return &airline{} }

func (*airline) env() string           { return Airline }
func (*airline) policy() string        { return airlinePolicy }
func (*airline) tools() []schemas.Tool { return airlineTools }
func (*airline) poolSize() int         { return 50 }

func (*airline) kinds() ([]string, []string, []string) {
	return []string{"baggage_info", "reservation_info"},
		[]string{"change_flight", "add_bags"},
		[]string{"cancel+add_bags", "change_flight+add_bags", "cancel+book", "change_flight+certificate", "cancel+cancel+change_flight"}
}

func (*airline) writeError(kind string) bool {
	return strings.HasPrefix(kind, "change_flight") || strings.HasPrefix(kind, "add_bags")
}

func flightNumber(rng *rand.Rand) string { return "HAT" + fmt.Sprintf("%03d", 1+rng.IntN(299)) }

func (*airline) newSeg(rng *rand.Rand, from, to, date string) airSeg {
	h := 5 + rng.IntN(15)
	m := []string{"00", "30"}[rng.IntN(2)]
	dur := 2 + rng.IntN(5)
	base := 60 + rng.IntN(140)
	return airSeg{
		num: flightNumber(rng), from: from, to: to, date: date,
		dep: fmt.Sprintf("%02d:%s:00", h, m), arr: fmt.Sprintf("%02d:%s:00", (h+dur)%24, m),
		prices: map[string]int{"basic_economy": base, "economy": base + 40 + rng.IntN(80), "business": base + 250 + rng.IntN(400)},
	}
}

func (a *airline) newTask(rng *rand.Rand, id int, kind, errSite string) *task {
	p := newPerson(rng)
	u := &airUser{
		p: p, id: p.userID(rng), membership: pick(rng, []string{"regular", "regular", "silver", "gold"}),
		addr: newAddress(rng),
	}
	u.email = strings.ToLower(p.first+"."+p.last) + digits(rng, 4) + "@example.com"
	u.card = airPay{id: "credit_card_" + digits(rng, 7), source: "credit_card", brand: pick(rng, []string{"visa", "mastercard"}), last4: digits(rng, 4)}
	u.gift = airPay{id: "gift_card_" + digits(rng, 7), source: "gift_card", balance: float64(150 + rng.IntN(250))}
	companion := newPerson(rng)
	used := map[string]bool{}
	for i := 0; i < 3; i++ {
		var from, to int
		for from == to || used[airports[from].code+airports[to].code] {
			from, to = rng.IntN(len(airports)), rng.IntN(len(airports))
		}
		used[airports[from].code+airports[to].code] = true
		date := fmt.Sprintf("2024-05-%02d", 16+rng.IntN(10))
		r := &airRes{
			id: upperAlnum(rng, 6), userID: u.id, from: airports[from].code, to: airports[to].code,
			cabin: pick(rng, cabins), seg: a.newSeg(rng, airports[from].code, airports[to].code, date),
			created: fmt.Sprintf("2024-05-%02dT%02d:%02d:%02d", 1+rng.IntN(13), rng.IntN(24), rng.IntN(60), rng.IntN(60)),
			pax:     []person{p}, payID: u.card.id, insurance: pick(rng, []string{"yes", "no"}),
		}
		if rng.IntN(2) == 0 {
			r.pax = append(r.pax, companion)
		}
		r.bags = rng.IntN(2) * len(r.pax)
		r.nonfree = max(0, r.bags-freeBags(u.membership, r.cabin)*len(r.pax))
		r.paid = []obj{{{"payment_id", u.card.id}, {"amount", r.total()}}}
		u.res = append(u.res, r)
	}
	d := &airTask{u: u, payGift: errSite == "write", typoID: typo(u.id)}
	t := &task{id: strconv.Itoa(id), kind: kind, errSite: errSite, data: d}

	ri := 0
	next := func() *airRes { r := u.res[ri]; ri++; return r }
	search := func(act *airAct, r *airRes) {
		act.date = fmt.Sprintf("2024-05-%02d", 26+rng.IntN(4))
		seen := map[string]bool{r.seg.num: true}
		for len(act.opts) < 3 {
			s := a.newSeg(rng, r.from, r.to, act.date)
			if !seen[s.num] {
				seen[s.num] = true
				act.opts = append(act.opts, s)
			}
		}
		act.pick = rng.IntN(3)
		// The new fare is higher than the old one, so a change costs money.
		pk := &act.opts[act.pick]
		for _, c := range cabins {
			pk.prices[c] = max(pk.prices[c], r.seg.prices[c]+20+rng.IntN(120))
		}
	}
	for _, part := range strings.Split(kind, "+") {
		switch part {
		case "baggage_info":
			d.ro, d.roRes = "baggage", next()
		case "reservation_info":
			d.ro, d.roRes = "info", next()
		case "cancel":
			d.acts = append(d.acts, &airAct{kind: "cancel", res: next()})
		case "change_flight":
			act := &airAct{kind: "change", res: next()}
			search(act, act.res)
			d.acts = append(d.acts, act)
		case "add_bags":
			r := (*airRes)(nil)
			if n := len(d.acts); n > 0 && d.acts[n-1].kind == "change" {
				r = d.acts[n-1].res
			} else {
				r = next()
			}
			act := &airAct{kind: "bags", res: r}
			free := freeBags(u.membership, r.cabin) * len(r.pax)
			act.add = 1 + rng.IntN(2)
			if d.payGift || rng.IntN(2) == 0 { // make some (all, for the error) bags paid
				act.add = max(act.add, free-r.bags+1+rng.IntN(2))
			}
			act.total = r.bags + act.add
			act.nonfree = max(r.nonfree, act.total-free)
			d.acts = append(d.acts, act)
		case "book":
			prev := d.acts[len(d.acts)-1].res
			act := &airAct{kind: "book", res: &airRes{from: prev.from, to: prev.to, cabin: prev.cabin, pax: []person{p}}, newID: upperAlnum(rng, 6)}
			act.res.seg = prev.seg
			search(act, prev)
			d.acts = append(d.acts, act)
		case "certificate":
			prev := d.acts[len(d.acts)-1].res
			d.acts = append(d.acts, &airAct{kind: "cert", amount: 50 * len(prev.pax), newID: "certificate_" + digits(rng, 7)})
		default:
			panic("simulate: unknown airline task part " + part)
		}
	}
	if d.payGift {
		// The gift card covers less than the first charge.
		c := d.acts[0].cost()
		if c <= 0 {
			panic("simulate: airline write error needs a charge")
		}
		u.gift.balance = float64(max(5, c*(20+rng.IntN(50))/100))
	}

	t.required = []string{"get_user_details"}
	read := map[*airRes]bool{}
	for _, act := range d.acts {
		if act.kind != "book" && act.kind != "cert" && !read[act.res] {
			t.required = append(t.required, "get_reservation_details")
			read[act.res] = true
		}
	}
	if d.ro != "" {
		t.required = append(t.required, "get_reservation_details")
	}
	for _, act := range d.acts {
		if act.kind == "change" || act.kind == "book" {
			t.required = append(t.required, "search_direct_flight")
		}
	}
	for _, act := range d.acts {
		t.required = append(t.required, act.tool())
	}
	t.writes = len(d.acts)
	return t
}

// --- JSON views ---

func (u *airUser) json() string {
	var res []string
	for _, r := range u.res {
		res = append(res, r.id)
	}
	return pyJSON(obj{
		{"user_id", u.id},
		{"name", obj{{"first_name", u.p.first}, {"last_name", u.p.last}}},
		{"address", u.addr.json()},
		{"email", u.email},
		{"dob", u.p.dob},
		{"payment_methods", obj{
			{u.card.id, obj{{"source", "credit_card"}, {"brand", u.card.brand}, {"last_four", u.card.last4}, {"id", u.card.id}}},
			{u.gift.id, obj{{"source", "gift_card"}, {"amount", u.gift.balance}, {"id", u.gift.id}}},
		}},
		{"saved_passengers", []any{}},
		{"membership", u.membership},
		{"reservations", res},
	})
}

func (r *airRes) json(status any) string {
	var pax []obj
	for _, p := range r.pax {
		pax = append(pax, obj{{"first_name", p.first}, {"last_name", p.last}, {"dob", p.dob}})
	}
	return pyJSON(obj{
		{"reservation_id", r.id},
		{"user_id", r.userID},
		{"origin", r.from},
		{"destination", r.to},
		{"flight_type", "one_way"},
		{"cabin", r.cabin},
		{"flights", []obj{{{"flight_number", r.seg.num}, {"origin", r.seg.from}, {"destination", r.seg.to}, {"date", r.seg.date}, {"price", r.price()}}}},
		{"passengers", pax},
		{"payment_history", r.paid},
		{"created_at", r.created},
		{"total_baggages", r.bags},
		{"nonfree_baggages", r.nonfree},
		{"insurance", r.insurance},
		{"status", status},
	})
}

func searchJSON(opts []airSeg) string {
	var out []obj
	for _, s := range opts {
		out = append(out, obj{
			{"flight_number", s.num}, {"origin", s.from}, {"destination", s.to}, {"status", "available"},
			{"scheduled_departure_time_est", s.dep}, {"scheduled_arrival_time_est", s.arr}, {"date", s.date},
			{"available_seats", obj{{"basic_economy", 3 + len(s.num)%7}, {"economy", 5 + len(s.dep)}, {"business", 4}}},
			{"prices", obj{{"basic_economy", s.prices["basic_economy"]}, {"economy", s.prices["economy"]}, {"business", s.prices["business"]}}},
		})
	}
	return pyJSON(out)
}

// --- the conversation ---

var affirmatives = []string{
	"Yes, please go ahead.", "Yes, that's correct. Please proceed.", "Yes please.", "yes", "Yes, go ahead.",
	"Yes, that all looks right.", "Yes — please do it.",
}

var greetings = []string{"Hi! How can I help you today?", "Hello! How can I help you today?"}

func (a *airline) request(rng *rand.Rand, t *task, d *airTask) string {
	u := d.u
	uid := u.id
	if t.errSite == "lookup" {
		uid = d.typoID
	}
	var parts []string
	for i, act := range d.acts {
		r := act.res
		var s string
		switch act.kind {
		case "cancel":
			s = fmt.Sprintf("cancel reservation %s (%s to %s on %s) because my plans changed", r.id, r.from, r.to, r.seg.date)
		case "bags":
			if i > 0 && d.acts[i-1].res == r {
				s = fmt.Sprintf("add %d checked bag%s to that same booking, which has %d checked bag%s right now", act.add, plural(act.add), r.bags, plural(r.bags))
			} else {
				s = fmt.Sprintf("add %d checked bag%s to reservation %s (we're in %s and it has %d checked bag%s right now)", act.add, plural(act.add), r.id, cabinName(r.cabin), r.bags, plural(r.bags))
			}
		case "change":
			s = fmt.Sprintf("move my %s flight from %s to %s on %s (reservation %s) to %s", cabinName(r.cabin), r.from, r.to, r.seg.date, r.id, act.date)
		case "book":
			s = fmt.Sprintf("book a new one-way %s flight from %s to %s on %s, just for me", cabinName(r.cabin), r.from, r.to, act.date)
		case "cert":
			who := "I'm the only passenger on it"
			if n := d.acts[i-1].res.paxCount(); n > 1 {
				who = fmt.Sprintf("there are %d of us on it", n)
			}
			s = fmt.Sprintf("get the compensation I'm entitled to, because my original flight on that booking was delayed (%s)", who)
		}
		parts = append(parts, s)
	}
	var b strings.Builder
	b.WriteString(pick(rng, []string{"Hi! ", "Hello! ", "Hi there. ", "Good afternoon. "}))
	switch d.ro {
	case "baggage":
		fmt.Fprintf(&b, "How many checked bags can I bring for free on reservation %s?", d.roRes.id)
	case "info":
		fmt.Fprintf(&b, "Could you tell me the details of reservation %s, including how much I paid for it?", d.roRes.id)
	default:
		lead := pick(rng, []string{"I'd like to ", "I need to ", "Could you help me "})
		b.WriteString(lead)
		b.WriteString(parts[0])
		for i, p := range parts[1:] {
			if i == len(parts)-2 {
				b.WriteString(", and then ")
			} else {
				b.WriteString(", then ")
			}
			b.WriteString(p)
		}
		if strings.HasPrefix(lead, "Could") {
			b.WriteString("?")
		} else {
			b.WriteString(".")
		}
	}
	fmt.Fprintf(&b, " My user id is %s.", uid)
	if d.ro == "" {
		pays := false
		for _, act := range d.acts {
			pays = pays || act.kind == "bags" || act.kind == "change" || act.kind == "book"
		}
		if pays && d.payGift {
			b.WriteString(" Please put any charges on my gift card.")
		} else if pays {
			b.WriteString(" Please use my credit card for any charges.")
		}
	}
	return b.String()
}

func (r *airRes) paxCount() int { return len(r.pax) }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (a *airline) play(ep *episode, t *task) {
	d := t.data.(*airTask)
	c, rng, u := ep.c, ep.rng, d.u

	c.assistant(pick(rng, greetings))
	c.user(a.request(rng, t, d))

	if t.errSite == "lookup" {
		c.call("", callSpec{name: "get_user_details", args: map[string]any{"user_id": d.typoID}, result: "Error: User not found", err: true})
		ep.errHit = true
		if ep.lacking(ToolErrorRecovery) {
			for _, act := range d.acts {
				ep.miss(act.tool(), a.args(act, u.id, u.card.id, ""))
			}
			ep.giveUp(fmt.Sprintf("I'm sorry, I couldn't find a profile with the user id %s, so I can't access your reservations. I'll transfer you to a human agent who can look into it.", d.typoID),
				fmt.Sprintf("User gave user id %s, which was not found; could not authenticate the user.", d.typoID))
			return
		}
		c.assistant(fmt.Sprintf("I couldn't find a profile with the user id %s. Could you double-check it for me?", d.typoID))
		c.user(fmt.Sprintf(pick(rng, []string{"Sorry about that, it's %s.", "Oops, my mistake. It should be %s.", "Let me check... it's %s."}), u.id))
	}
	c.call("", callSpec{name: "get_user_details", args: map[string]any{"user_id": u.id}, result: u.json()})

	if d.ro != "" {
		r := d.roRes
		c.call("", callSpec{name: "get_reservation_details", args: map[string]any{"reservation_id": r.id}, result: r.json(nil)})
		switch d.ro {
		case "baggage":
			f := freeBags(u.membership, r.cabin)
			msg := "As a %s member flying %s, each passenger on reservation %s can check %d bag%s for free, so %d free bag%s in total for the %d passenger%s on the booking. Each additional bag is $50. Is there anything else I can help you with?"
			ep.final = finalMsg{
				right: fmt.Sprintf(msg, u.membership, cabinName(r.cabin), r.id, f, plural(f), f*len(r.pax), plural(f*len(r.pax)), len(r.pax), plural(len(r.pax))),
				wrong: fmt.Sprintf(msg, u.membership, cabinName(r.cabin), r.id, f+1, plural(f+1), (f+1)*len(r.pax), plural((f+1)*len(r.pax)), len(r.pax), plural(len(r.pax))),
				fact:  fmt.Sprintf("%d free checked bags per passenger", f),
			}
		default:
			msg := "Reservation %s is a one-way %s trip from %s to %s on %s (flight %s, departing at %s) for %d passenger%s. The total paid was %s, charged to your credit card ending in %s. Is there anything else I can help you with?"
			ep.final = finalMsg{
				right: fmt.Sprintf(msg, r.id, cabinName(r.cabin), r.from, r.to, r.seg.date, r.seg.num, r.seg.dep[:5], len(r.pax), plural(len(r.pax)), money(float64(r.total())), u.card.last4),
				wrong: fmt.Sprintf(msg, r.id, cabinName(r.cabin), r.from, r.to, r.seg.date, r.seg.num, r.seg.dep[:5], len(r.pax), plural(len(r.pax)), money(float64(r.total()+40)), u.card.last4),
				fact:  "total paid " + money(float64(r.total())),
			}
		}
		return
	}

	// Read every reservation the writes modify, unless the agent skips
	// the precondition check.
	read := map[*airRes]bool{}
	if !ep.lacking(PreconditionVerification) {
		for _, act := range d.acts {
			if act.kind != "book" && act.kind != "cert" && !read[act.res] {
				c.call("", callSpec{name: "get_reservation_details", args: map[string]any{"reservation_id": act.res.id}, result: act.res.json(nil)})
				read[act.res] = true
			}
		}
	}
	for _, act := range d.acts {
		if act.kind != "change" && act.kind != "book" {
			continue
		}
		r := act.res
		c.call("", callSpec{name: "search_direct_flight", args: map[string]any{"origin": r.from, "destination": r.to, "date": act.date}, result: searchJSON(act.opts)})
		var b strings.Builder
		fmt.Fprintf(&b, "Here are the direct flights from %s to %s on %s in %s:\n", r.from, r.to, act.date, cabinName(r.cabin))
		for i, o := range act.opts {
			fmt.Fprintf(&b, "%d. %s, departs %s, arrives %s, %s per passenger\n", i+1, o.num, o.dep[:5], o.arr[:5], money(float64(o.prices[r.cabin])))
		}
		b.WriteString("Which one would you like?")
		c.assistant(b.String())
		o := act.opts[act.pick]
		c.user(fmt.Sprintf(pick(rng, []string{"The %[2]s departure works for me.", "I'll take flight %[1]s.", "Let's do the one leaving at %[2]s."}), o.num, o.dep[:5]))
	}

	pay := func(act *airAct) string {
		switch {
		case act.cost() == 0:
			return "no charge"
		case act.cost() < 0:
			return money(float64(-act.cost())) + " refunded to the original payment method"
		default:
			return fmt.Sprintf("%s charged to your %s", money(float64(act.cost())), payName(d, act == d.acts[0]))
		}
	}
	if ep.confirms() {
		var b strings.Builder
		b.WriteString("Here is what I'm about to do:\n")
		for _, act := range d.acts {
			r := act.res
			switch act.kind {
			case "cancel":
				fmt.Fprintf(&b, "- Cancel reservation %s (%s to %s on %s); %s.\n", r.id, r.from, r.to, r.seg.date, pay(act))
			case "bags":
				fmt.Fprintf(&b, "- Add %d checked bag%s to reservation %s (%d in total, %d paid); %s.\n", act.add, plural(act.add), r.id, act.total, act.nonfree, pay(act))
			case "change":
				o := act.opts[act.pick]
				fmt.Fprintf(&b, "- Change reservation %s to flight %s on %s (departs %s); fare difference %s.\n", r.id, o.num, o.date, o.dep[:5], pay(act))
			case "book":
				o := act.opts[act.pick]
				fmt.Fprintf(&b, "- Book flight %s from %s to %s on %s in %s for %s; %s.\n", o.num, r.from, r.to, o.date, cabinName(r.cabin), u.p.name(), pay(act))
			case "cert":
				fmt.Fprintf(&b, "- Send a $%d travel certificate to your profile as compensation for the delay.\n", act.amount)
			}
		}
		b.WriteString("Shall I go ahead? (yes/no)")
		c.assistant(b.String())
		c.user(pick(rng, affirmatives))
	}

	n := ep.stopAfter(len(d.acts))
	fab := -1
	for i, act := range d.acts {
		if act.kind == "change" || act.kind == "bags" || act.kind == "book" {
			fab = i
			break
		}
	}
	fabricated := func(i int) bool { return i == fab && ep.lacking(ArgumentGrounding) }
	var done []*airAct
	for i, act := range d.acts {
		payID := u.card.id
		if i == 0 && d.payGift {
			payID = u.gift.id
		}
		fakeFlight := ""
		if fabricated(i) && act.kind != "bags" {
			fakeFlight = ep.fabricate(func() string { return flightNumber(rng) })
		}
		args := a.args(act, u.id, payID, fakeFlight)
		if i >= n {
			ep.miss(act.tool(), a.args(act, u.id, u.card.id, ""))
			continue
		}
		rec := writeRec{entityRead: act.kind == "book" || act.kind == "cert" || read[act.res], grounded: fakeFlight == "", confirmed: ep.confirms()}
		if i == 0 && d.payGift {
			ep.write("", callSpec{name: act.tool(), args: args, result: "Error: Not enough balance in payment method " + u.gift.id, err: true}, rec)
			ep.errHit = true
			if ep.lacking(ToolErrorRecovery) {
				for _, rest := range d.acts {
					ep.miss(rest.tool(), a.args(rest, u.id, u.card.id, ""))
				}
				ep.giveUp("I'm sorry, the payment could not be processed, so I'm unable to make this change. I'll transfer you to a human agent who can help you further.",
					fmt.Sprintf("User %s requested %s; the payment with %s failed.", u.id, act.tool(), u.gift.id))
				return
			}
			c.assistant(fmt.Sprintf("Your gift card only has a balance of %s, which doesn't cover the %s. Would you like me to charge your credit card ending in %s instead?",
				money(u.gift.balance), money(float64(act.cost())), u.card.last4))
			c.user(pick(rng, []string{"Yes, please use the credit card.", "Yes, charge the credit card then.", "Yes, that's fine, use the card."}))
			rec.confirmed = true
			payID = u.card.id
			args = a.args(act, u.id, payID, fakeFlight)
		}
		if fabricated(i) && act.kind == "bags" {
			args["payment_id"] = ep.fabricate(func() string { return "credit_card_" + digits(rng, 7) })
			rec.grounded = false
		}
		ep.write("", callSpec{name: act.tool(), args: args, result: a.result(act, args, u)}, rec)
		done = append(done, act)
	}

	ep.conclude("All done.", len(done), func(i int) (s, w string) {
		act := done[i]
		r := act.res
		switch act.kind {
		case "cancel":
			f := "Reservation %s has been cancelled, and the refund of %s will go back to your original payment method within 5 to 7 business days."
			s, w = fmt.Sprintf(f, r.id, money(float64(r.total()))), fmt.Sprintf(f, r.id, money(float64(r.total()+50)))
			if i == 0 {
				ep.final.fact = "refund of " + money(float64(r.total()))
			}
		case "bags":
			f := "Reservation %s now has %d checked bags (%d paid); %s."
			s = fmt.Sprintf(f, r.id, act.total, act.nonfree, pay(act))
			w = fmt.Sprintf(f, r.id, act.total+1, act.nonfree+1, money(float64(act.cost()+50))+" charged")
			if i == 0 {
				ep.final.fact = fmt.Sprintf("%d checked bags in total", act.total)
			}
		case "change":
			o := act.opts[act.pick]
			f := "Reservation %s is now on flight %s on %s, departing at %s; fare difference %s."
			s = fmt.Sprintf(f, r.id, o.num, o.date, o.dep[:5], pay(act))
			w = fmt.Sprintf(f, r.id, o.num, o.date, o.dep[:5], money(float64(act.cost()+30))+" charged")
			if i == 0 {
				ep.final.fact = "fare difference of " + money(float64(act.cost()))
			}
		case "book":
			o := act.opts[act.pick]
			f := "Your new reservation %s on flight %s (%s to %s on %s) is booked; %s."
			s = fmt.Sprintf(f, act.newID, o.num, r.from, r.to, o.date, pay(act))
			w = fmt.Sprintf(f, act.newID, o.num, r.from, r.to, o.date, money(float64(act.cost()+25))+" charged")
			if i == 0 {
				ep.final.fact = "new reservation " + act.newID
			}
		case "cert":
			f := "I've also sent a travel certificate of $%d to your profile as compensation for the delay."
			s, w = fmt.Sprintf(f, act.amount), fmt.Sprintf(f, act.amount+50)
		}
		return s, w
	})
}

func payName(d *airTask, first bool) string {
	if first && d.payGift {
		return "gift card"
	}
	return "credit card ending in " + d.u.card.last4
}

// args are the arguments of an action's write call.
func (a *airline) args(act *airAct, uid, payID, fakeFlight string) map[string]any {
	r := act.res
	flight := func() []any {
		o := act.opts[act.pick]
		num := o.num
		if fakeFlight != "" {
			num = fakeFlight
		}
		return []any{map[string]any{"flight_number": num, "date": o.date}}
	}
	switch act.kind {
	case "cancel":
		return map[string]any{"reservation_id": r.id}
	case "bags":
		return map[string]any{"reservation_id": r.id, "total_baggages": act.total, "nonfree_baggages": act.nonfree, "payment_id": payID}
	case "change":
		return map[string]any{"reservation_id": r.id, "cabin": r.cabin, "flights": flight(), "payment_id": payID}
	case "book":
		p := r.pax[0]
		return map[string]any{
			"user_id": uid, "origin": r.from, "destination": r.to, "flight_type": "one_way", "cabin": r.cabin,
			"flights":         flight(),
			"passengers":      []any{map[string]any{"first_name": p.first, "last_name": p.last, "dob": p.dob}},
			"payment_methods": []any{map[string]any{"payment_id": payID, "amount": act.cost()}},
			"total_baggages":  0, "nonfree_baggages": 0, "insurance": "no",
		}
	case "cert":
		return map[string]any{"user_id": uid, "amount": act.amount}
	}
	panic("simulate: unknown airline action " + act.kind)
}

// result is the environment's answer to a successful write.
func (a *airline) result(act *airAct, args map[string]any, u *airUser) string {
	if act.kind == "cert" {
		return fmt.Sprintf("Certificate %s added to user %s with amount %d.", act.newID, u.id, act.amount)
	}
	r := *act.res
	switch act.kind {
	case "cancel":
		r.paid = append(append([]obj{}, r.paid...), obj{{"payment_id", r.payID}, {"amount", -r.total()}})
		return r.json("cancelled")
	case "bags":
		r.bags, r.nonfree = act.total, act.nonfree
		if c := act.cost(); c > 0 {
			r.paid = append(append([]obj{}, r.paid...), obj{{"payment_id", args["payment_id"]}, {"amount", c}})
		}
		return r.json(nil)
	case "change", "book":
		o := act.opts[act.pick]
		o.num = args["flights"].([]any)[0].(map[string]any)["flight_number"].(string)
		r.seg = o
		pid := ""
		if act.kind == "change" {
			pid = args["payment_id"].(string)
		} else {
			pid = args["payment_methods"].([]any)[0].(map[string]any)["payment_id"].(string)
			r.id, r.userID, r.insurance, r.bags, r.nonfree = act.newID, u.id, "no", 0, 0
			r.created = "2024-05-15T15:00:00"
			r.paid = nil
		}
		if c := act.cost(); c > 0 {
			r.paid = append(append([]obj{}, r.paid...), obj{{"payment_id", pid}, {"amount", c}})
		}
		return r.json(nil)
	}
	panic("simulate: unknown airline action " + act.kind)
}
