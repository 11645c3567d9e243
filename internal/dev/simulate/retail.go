package simulate

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/traceops/trace/schemas"
)

const retailPolicy = `# Retail agent policy

As a retail agent you help users cancel or modify pending orders, return or exchange delivered orders, modify their default address, and answer questions about orders, products and their profile.

## General rules
- Authenticate the user first: find their user id by email, or by first name, last name and zip code, even when they give you a user id.
- Before you cancel, modify, return or exchange anything, read the order with get_order_details and check its status: only pending orders can be cancelled or modified, only delivered orders can be returned or exchanged.
- Before any action that changes the database (cancel, modify, return, exchange, change an address), list the details of the action and obtain the user's explicit confirmation ("yes") to proceed.
- Only use identifiers (order ids, item ids, product ids, payment method ids) that the user gave you or that a tool returned. Never make one up; an item id is not a product id.
- Make one tool call at a time. Do not answer the user in the same turn as a tool call.
- If a tool returns an error, read the message, fix the call (ask the user when you need information) and try again. Transfer to a human agent only when the request cannot be handled within this policy.
- Complete every request of the user before you end the conversation.

## Refunds and payment
A refund goes to the original payment method or to a gift card of the user. A price difference of an exchange is paid with, or refunded to, a payment method of the user's profile. A gift card must have enough balance.`

var productDefs = []struct {
	name string
	base float64
	dims []string
	vals [][]string
}{
	{"Water Bottle", 25, []string{"capacity", "material", "color"}, [][]string{{"500ml", "750ml", "1000ml"}, {"plastic", "glass", "stainless steel"}, {"blue", "black", "green", "red"}}},
	{"Mechanical Keyboard", 180, []string{"switch type", "backlight", "size"}, [][]string{{"clicky", "linear", "tactile"}, {"none", "white", "RGB"}, {"60%", "80%", "full size"}}},
	{"T-Shirt", 30, []string{"color", "size", "material"}, [][]string{{"blue", "red", "black", "purple"}, {"S", "M", "L", "XL"}, {"cotton", "polyester"}}},
	{"Running Shoes", 110, []string{"size", "color", "material"}, [][]string{{"8", "9", "10", "11"}, {"black", "white", "red"}, {"mesh", "leather"}}},
	{"Desk Lamp", 90, []string{"color", "brightness", "power source"}, [][]string{{"white", "black", "silver"}, {"low", "medium", "high"}, {"AC adapter", "battery", "USB"}}},
	{"Bluetooth Speaker", 120, []string{"color", "battery life", "water resistance"}, [][]string{{"black", "blue", "red"}, {"10 hours", "20 hours"}, {"IPX4", "IPX7", "none"}}},
	{"Hiking Boots", 200, []string{"size", "material", "waterproof"}, [][]string{{"8", "9", "10", "11", "12"}, {"leather", "synthetic"}, {"full", "partial"}}},
	{"Backpack", 95, []string{"color", "size", "material"}, [][]string{{"black", "grey", "navy", "green"}, {"small", "medium", "large"}, {"nylon", "polyester", "leather"}}},
	{"Coffee Maker", 140, []string{"color", "capacity", "type"}, [][]string{{"black", "stainless steel", "white"}, {"1 cup", "4 cups", "8 cups", "12 cups"}, {"drip", "espresso", "french press"}}},
	{"Wireless Earbuds", 150, []string{"color", "battery life", "water resistance"}, [][]string{{"black", "white", "blue"}, {"4 hours", "6 hours", "8 hours"}, {"IPX4", "IPX7", "not resistant"}}},
	{"Smart Watch", 300, []string{"color", "band material", "display"}, [][]string{{"black", "silver", "gold"}, {"leather", "silicone", "metal"}, {"AMOLED", "LCD"}}},
	{"Office Chair", 350, []string{"material", "color", "armrest"}, [][]string{{"mesh", "leather", "fabric"}, {"black", "gray", "blue"}, {"fixed", "adjustable", "none"}}},
}

type variant struct {
	id        string
	opts      obj // dimension -> value, in dimension order
	available bool
	price     float64
}

func (v *variant) describe() string {
	var parts []string
	for _, o := range v.opts {
		parts = append(parts, fmt.Sprintf("%s %s", o.k, o.v))
	}
	return strings.Join(parts, ", ")
}

type product struct {
	name, id string
	variants []*variant
}

type retailItem struct {
	prod *product
	v    *variant
}

type retailOrder struct {
	id, status string
	items      []retailItem
	addr       address
	payID      string
	tracking   string
}

func (o *retailOrder) total() float64 {
	t := 0.0
	for _, it := range o.items {
		t += it.v.price
	}
	return round2(t)
}

type retailPay struct {
	id, source, brand, last4 string
	balance                  float64
}

type retailUser struct {
	p           person
	id, email   string
	addr        address
	card, pp, g retailPay
	orders      []*retailOrder
}

func (u *retailUser) payName(id string) string {
	switch id {
	case u.card.id:
		return "credit card ending in " + u.card.last4
	case u.pp.id:
		return "PayPal account"
	case u.g.id:
		return "gift card"
	}
	return id
}

type retailAct struct {
	kind  string // cancel | address | return | exchange
	order *retailOrder
	item  retailItem
	newV  *variant // exchange target (available)
	badV  *variant // exchange: the unavailable variant the user first asks for (tool error)
	pay   string   // refund / price difference payment method id
	addr  address  // new address
}

func (a *retailAct) tool() string {
	return map[string]string{
		"cancel": "cancel_pending_order", "address": "modify_pending_order_address",
		"return": "return_delivered_order_items", "exchange": "exchange_delivered_order_items",
	}[a.kind]
}

type retailTask struct {
	u         *retailUser
	acts      []*retailAct
	ro        string // "order_status" | "product_info"
	roOrder   *retailOrder
	roProd    *product
	emailTypo string
	errWrite  bool
}

type retail struct {
	products []*product
	byName   []string
}

func newRetail(seed uint64) *retail {
	rng := rand.New(rand.NewPCG(mix64(seed)^0x72657461696c, binary.BigEndian.Uint64([]byte("catalog!"))))
	r := &retail{}
	for _, def := range productDefs {
		p := &product{name: def.name, id: digits(rng, 10)}
		seen := map[string]bool{}
		n := 7 + rng.IntN(3)
		for len(p.variants) < n {
			v := &variant{id: digits(rng, 10)}
			key := ""
			for i, dim := range def.dims {
				val := pick(rng, def.vals[i])
				v.opts = append(v.opts, kv{dim, val})
				key += val + "|"
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			v.price = round2(def.base * (0.8 + 0.4*rng.Float64()))
			v.available = len(p.variants) < 4 || (len(p.variants) >= 6 && rng.IntN(2) == 0)
			p.variants = append(p.variants, v)
		}
		rng.Shuffle(len(p.variants), func(i, j int) { p.variants[i], p.variants[j] = p.variants[j], p.variants[i] })
		r.products = append(r.products, p)
	}
	return r
}

func (*retail) env() string           { return Retail }
func (*retail) policy() string        { return retailPolicy }
func (*retail) tools() []schemas.Tool { return retailTools }
func (*retail) poolSize() int         { return 114 }

func (*retail) kinds() ([]string, []string, []string) {
	return []string{"order_status", "product_info"},
		[]string{"return", "exchange"},
		[]string{"cancel+return", "exchange+address", "return+exchange", "cancel+return+exchange"}
}

func (*retail) writeError(kind string) bool { return strings.HasPrefix(kind, "exchange") }

func (rt *retail) newOrder(rng *rand.Rand, u *retailUser, status string) *retailOrder {
	o := &retailOrder{id: "#W" + digits(rng, 7), status: status, addr: u.addr, payID: pick(rng, []string{u.card.id, u.pp.id})}
	used := map[*product]bool{}
	for n := 1 + rng.IntN(3); len(o.items) < n; {
		p := pick(rng, rt.products)
		if used[p] {
			continue
		}
		used[p] = true
		o.items = append(o.items, retailItem{prod: p, v: pick(rng, p.variants)})
	}
	if status == "delivered" {
		o.tracking = digits(rng, 12)
	}
	return o
}

func (rt *retail) newTask(rng *rand.Rand, id int, kind, errSite string) *task {
	p := newPerson(rng)
	u := &retailUser{p: p, id: p.userID(rng), addr: newAddress(rng)}
	u.email = strings.ToLower(p.first+"."+p.last) + digits(rng, 4) + "@example.com"
	u.card = retailPay{id: "credit_card_" + digits(rng, 7), source: "credit_card", brand: pick(rng, []string{"visa", "mastercard"}), last4: digits(rng, 4)}
	u.pp = retailPay{id: "paypal_" + digits(rng, 7), source: "paypal"}
	u.g = retailPay{id: "gift_card_" + digits(rng, 7), source: "gift_card", balance: float64(20 + rng.IntN(200))}
	pending := rt.newOrder(rng, u, "pending")
	d1, d2 := rt.newOrder(rng, u, "delivered"), rt.newOrder(rng, u, "delivered")
	u.orders = []*retailOrder{d1, pending, d2}
	rng.Shuffle(len(u.orders), func(i, j int) { u.orders[i], u.orders[j] = u.orders[j], u.orders[i] })

	d := &retailTask{u: u, emailTypo: typoEmail(u.email), errWrite: errSite == "write"}
	t := &task{id: strconv.Itoa(id), kind: kind, errSite: errSite, data: d}
	delivered := []*retailOrder{d1, d2}
	di := 0
	for _, part := range strings.Split(kind, "+") {
		switch part {
		case "order_status":
			d.ro, d.roOrder = part, pick(rng, u.orders)
		case "product_info":
			d.ro, d.roProd = part, pick(rng, rt.products)
		case "cancel":
			d.acts = append(d.acts, &retailAct{kind: "cancel", order: pending})
		case "address":
			d.acts = append(d.acts, &retailAct{kind: "address", order: pending, addr: newAddress(rng)})
		case "return":
			o := delivered[di]
			di++
			d.acts = append(d.acts, &retailAct{kind: "return", order: o, item: pick(rng, o.items), pay: pick(rng, []string{o.payID, u.g.id})})
		case "exchange":
			o := delivered[di]
			di++
			it := pick(rng, o.items)
			act := &retailAct{kind: "exchange", order: o, item: it, pay: pick(rng, []string{u.card.id, u.g.id})}
			var avail, unavail []*variant
			for _, v := range it.prod.variants {
				if v == it.v {
					continue
				}
				if v.available {
					avail = append(avail, v)
				} else {
					unavail = append(unavail, v)
				}
			}
			act.newV = pick(rng, avail)
			if d.errWrite && len(d.acts) == 0 {
				act.badV = pick(rng, unavail)
			}
			if act.pay == u.g.id { // the gift card must cover the difference
				u.g.balance = max(u.g.balance, float64(int(act.newV.price-it.v.price)+50))
			}
			d.acts = append(d.acts, act)
		default:
			panic("simulate: unknown retail task part " + part)
		}
	}
	if d.errWrite && (len(d.acts) == 0 || d.acts[0].badV == nil) {
		panic("simulate: retail write error needs an exchange first")
	}

	t.required = []string{"find_user_id_by_email", "get_user_details"}
	seen := map[*retailOrder]bool{}
	for _, act := range d.acts {
		if !seen[act.order] {
			seen[act.order] = true
			t.required = append(t.required, "get_order_details")
		}
		if act.kind == "exchange" {
			t.required = append(t.required, "get_product_details")
		}
	}
	switch d.ro {
	case "order_status":
		t.required = append(t.required, "get_order_details")
	case "product_info":
		t.required = append(t.required, "list_all_product_types", "get_product_details")
	}
	for _, act := range d.acts {
		t.required = append(t.required, act.tool())
	}
	t.writes = len(d.acts)
	return t
}

// typoEmail swaps two letters of the local part.
func typoEmail(e string) string {
	at := strings.IndexByte(e, '@')
	b := []byte(e)
	for i := 1; i < at-1; i++ {
		if b[i] != b[i+1] && b[i] != '.' && b[i+1] != '.' {
			b[i], b[i+1] = b[i+1], b[i]
			return string(b)
		}
	}
	return "x" + e
}

// --- JSON views ---

func (u *retailUser) json() string {
	var orders []string
	for _, o := range u.orders {
		orders = append(orders, o.id)
	}
	return pyJSON(obj{
		{"user_id", u.id},
		{"name", obj{{"first_name", u.p.first}, {"last_name", u.p.last}}},
		{"address", u.addr.json()},
		{"email", u.email},
		{"payment_methods", obj{
			{u.card.id, obj{{"source", "credit_card"}, {"brand", u.card.brand}, {"last_four", u.card.last4}, {"id", u.card.id}}},
			{u.pp.id, obj{{"source", "paypal"}, {"id", u.pp.id}}},
			{u.g.id, obj{{"source", "gift_card"}, {"balance", u.g.balance}, {"id", u.g.id}}},
		}},
		{"orders", orders},
	})
}

func (o *retailOrder) json(userID string, extra ...kv) string {
	var items []obj
	var ids []string
	for _, it := range o.items {
		items = append(items, obj{{"name", it.prod.name}, {"product_id", it.prod.id}, {"item_id", it.v.id}, {"price", it.v.price}, {"options", it.v.opts}})
		ids = append(ids, it.v.id)
	}
	var ful []obj
	if o.tracking != "" {
		ful = []obj{{{"tracking_id", []string{o.tracking}}, {"item_ids", ids}}}
	}
	status := o.status
	out := obj{{"order_id", o.id}, {"user_id", userID}, {"address", o.addr.json()}, {"items", items}, {"fulfillments", orEmpty(ful)}}
	for _, e := range extra {
		if e.k == "status" {
			status = e.v.(string)
		}
	}
	out = append(out, kv{"status", status})
	for _, e := range extra {
		if e.k != "status" {
			out = append(out, e)
		}
	}
	out = append(out, kv{"payment_history", []obj{{{"transaction_type", "payment"}, {"amount", o.total()}, {"payment_method_id", o.payID}}}})
	return pyJSON(out)
}

func orEmpty(x []obj) any {
	if x == nil {
		return []any{}
	}
	return x
}

func (p *product) json() string {
	vs := obj{}
	for _, v := range p.variants {
		vs = append(vs, kv{v.id, obj{{"item_id", v.id}, {"options", v.opts}, {"available", v.available}, {"price", v.price}}})
	}
	return pyJSON(obj{{"name", p.name}, {"product_id", p.id}, {"variants", vs}})
}

func (rt *retail) typesJSON() string {
	ps := append([]*product(nil), rt.products...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].name < ps[j].name })
	o := obj{}
	for _, p := range ps {
		o = append(o, kv{p.name, p.id})
	}
	return pyJSON(o)
}

// --- the conversation ---

func (rt *retail) request(rng *rand.Rand, t *task, d *retailTask) string {
	u := d.u
	var parts []string
	for _, act := range d.acts {
		var s string
		switch act.kind {
		case "cancel":
			s = fmt.Sprintf("cancel my pending order %s because I no longer need it", act.order.id)
		case "address":
			s = fmt.Sprintf("change the shipping address of my pending order %s to %s", act.order.id, act.addr)
		case "return":
			s = fmt.Sprintf("return the %s (%s) from order %s, with the refund going to my %s", act.item.prod.name, act.item.v.describe(), act.order.id, u.payName(act.pay))
		case "exchange":
			want := act.newV
			if act.badV != nil {
				want = act.badV
			}
			s = fmt.Sprintf("exchange the %s (%s) from order %s for one with %s, using my %s for any price difference", act.item.prod.name, act.item.v.describe(), act.order.id, want.describe(), u.payName(act.pay))
		}
		parts = append(parts, s)
	}
	var b strings.Builder
	b.WriteString(pick(rng, []string{"Hi! ", "Hello! ", "Hi there. ", "Hey! "}))
	switch d.ro {
	case "order_status":
		fmt.Fprintf(&b, "Could you tell me the status of my order %s and what's in it?", d.roOrder.id)
	case "product_info":
		fmt.Fprintf(&b, "I'm shopping for a %s. What's the cheapest option you have in stock right now?", strings.ToLower(d.roProd.name))
	default:
		lead := pick(rng, []string{"I'd like to ", "I need to ", "Could you help me "})
		b.WriteString(lead)
		b.WriteString(parts[0])
		for i, p := range parts[1:] {
			if i == len(parts)-2 {
				b.WriteString(", and also ")
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
	email := u.email
	if t.errSite == "lookup" {
		email = d.emailTypo
	}
	fmt.Fprintf(&b, " My email is %s.", email)
	return b.String()
}

func (rt *retail) play(ep *episode, t *task) {
	d := t.data.(*retailTask)
	c, rng, u := ep.c, ep.rng, d.u

	c.assistant(pick(rng, greetings))
	c.user(rt.request(rng, t, d))

	if t.errSite == "lookup" {
		c.call("", callSpec{name: "find_user_id_by_email", args: map[string]any{"email": d.emailTypo}, result: "Error: User not found", err: true})
		ep.errHit = true
		if ep.lacking(ToolErrorRecovery) {
			for _, act := range d.acts {
				ep.miss(act.tool(), rt.args(act, act.pay, "", act.newV))
			}
			ep.giveUp("I'm sorry, I couldn't find an account with that email address, so I can't look up your orders. I'll transfer you to a human agent who can help.",
				fmt.Sprintf("Could not authenticate the user: no account for email %s.", d.emailTypo))
			return
		}
		c.assistant("I couldn't find an account with that email address. Could you give me your first name, last name and zip code instead?")
		c.user(fmt.Sprintf(pick(rng, []string{"It's %s %s, zip code %s.", "My name is %s %s and my zip code is %s."}), u.p.first, u.p.last, u.addr.zip))
		c.call("", callSpec{name: "find_user_id_by_name_zip", args: map[string]any{"first_name": u.p.first, "last_name": u.p.last, "zip": u.addr.zip}, result: u.id})
	} else {
		c.call("", callSpec{name: "find_user_id_by_email", args: map[string]any{"email": u.email}, result: u.id})
	}
	c.call("", callSpec{name: "get_user_details", args: map[string]any{"user_id": u.id}, result: u.json()})

	switch d.ro {
	case "order_status":
		o := d.roOrder
		c.call("", callSpec{name: "get_order_details", args: map[string]any{"order_id": o.id}, result: o.json(u.id)})
		var items []string
		for _, it := range o.items {
			items = append(items, fmt.Sprintf("%s (%s, %s)", it.prod.name, it.v.describe(), money(it.v.price)))
		}
		f := "Your order %s is %s. It contains: %s, for a total of %s. Is there anything else I can help you with?"
		ep.final = finalMsg{
			right: fmt.Sprintf(f, o.id, o.status, strings.Join(items, "; "), money(o.total())),
			wrong: fmt.Sprintf(f, o.id, map[string]string{"pending": "delivered", "delivered": "pending"}[o.status], strings.Join(items, "; "), money(o.total())),
			fact:  "order " + o.id + " is " + o.status,
		}
		return
	case "product_info":
		p := d.roProd
		c.call("", callSpec{name: "list_all_product_types", args: map[string]any{}, result: rt.typesJSON()})
		c.call("", callSpec{name: "get_product_details", args: map[string]any{"product_id": p.id}, result: p.json()})
		var best, second *variant
		for _, v := range p.variants {
			if !v.available {
				continue
			}
			if best == nil || v.price < best.price {
				best, second = v, best
			} else if second == nil || v.price < second.price {
				second = v
			}
		}
		f := "The cheapest %s in stock is item %s (%s) at %s. Is there anything else I can help you with?"
		ep.final = finalMsg{
			right: fmt.Sprintf(f, strings.ToLower(p.name), best.id, best.describe(), money(best.price)),
			wrong: fmt.Sprintf(f, strings.ToLower(p.name), second.id, second.describe(), money(second.price)),
			fact:  fmt.Sprintf("cheapest available item %s at %s", best.id, money(best.price)),
		}
		return
	}

	read := map[*retailOrder]bool{}
	shown := map[*product]bool{}
	showProduct := func(p *product) {
		if !shown[p] {
			c.call("", callSpec{name: "get_product_details", args: map[string]any{"product_id": p.id}, result: p.json()})
			shown[p] = true
		}
	}
	if !ep.lacking(PreconditionVerification) {
		for _, act := range d.acts {
			if !read[act.order] {
				c.call("", callSpec{name: "get_order_details", args: map[string]any{"order_id": act.order.id}, result: act.order.json(u.id)})
				read[act.order] = true
			}
			if act.kind == "exchange" {
				showProduct(act.item.prod)
			}
		}
	} else {
		// Without reading the orders the agent finds the item ids in the
		// catalog.
		listed := false
		for _, act := range d.acts {
			if act.kind != "return" && act.kind != "exchange" {
				continue
			}
			if !listed {
				c.call("", callSpec{name: "list_all_product_types", args: map[string]any{}, result: rt.typesJSON()})
				listed = true
			}
			showProduct(act.item.prod)
		}
	}

	target := func(act *retailAct) *variant {
		if act.badV != nil {
			return act.badV
		}
		return act.newV
	}
	diff := func(act *retailAct, v *variant) float64 { return round2(v.price - act.item.v.price) }
	diffText := func(act *retailAct, v *variant) string {
		x := diff(act, v)
		switch {
		case x > 0:
			return fmt.Sprintf("a price difference of %s charged to your %s", money(x), u.payName(act.pay))
		case x < 0:
			return fmt.Sprintf("a price difference of %s refunded to your %s", money(-x), u.payName(act.pay))
		}
		return "no price difference"
	}
	if ep.confirms() {
		var b strings.Builder
		b.WriteString("Here is what I'm about to do:\n")
		for _, act := range d.acts {
			switch act.kind {
			case "cancel":
				fmt.Fprintf(&b, "- Cancel pending order %s (reason: no longer needed); %s will be refunded to your %s.\n", act.order.id, money(act.order.total()), u.payName(act.order.payID))
			case "address":
				fmt.Fprintf(&b, "- Change the shipping address of order %s to %s.\n", act.order.id, act.addr)
			case "return":
				fmt.Fprintf(&b, "- Return the %s (item %s) from order %s; %s will be refunded to your %s.\n", act.item.prod.name, act.item.v.id, act.order.id, money(act.item.v.price), u.payName(act.pay))
			case "exchange":
				v := target(act)
				fmt.Fprintf(&b, "- Exchange the %s (item %s) in order %s for item %s (%s), with %s.\n", act.item.prod.name, act.item.v.id, act.order.id, v.id, v.describe(), diffText(act, v))
			}
		}
		b.WriteString("Do you confirm? (yes/no)")
		c.assistant(b.String())
		c.user(pick(rng, affirmatives))
	}

	n := ep.stopAfter(len(d.acts))
	fab := -1
	for i, act := range d.acts {
		if act.kind == "return" || act.kind == "exchange" {
			fab = i
			break
		}
	}
	var done []*retailAct
	for i, act := range d.acts {
		if i >= n {
			ep.miss(act.tool(), rt.args(act, act.pay, "", act.newV))
			continue
		}
		rec := writeRec{entityRead: read[act.order], grounded: true, confirmed: ep.confirms()}
		v := target(act)
		if act.badV != nil {
			ep.write("", callSpec{name: act.tool(), args: rt.args(act, act.pay, "", v), result: fmt.Sprintf("Error: New item %s not found or available", v.id), err: true}, rec)
			ep.errHit = true
			if ep.lacking(ToolErrorRecovery) {
				for _, rest := range d.acts {
					ep.miss(rest.tool(), rt.args(rest, rest.pay, "", rest.newV))
				}
				ep.giveUp("I'm sorry, the exchange could not be processed, so I'm unable to complete it. I'll transfer you to a human agent who can help you further.",
					fmt.Sprintf("User %s wants to exchange item %s in order %s; the exchange failed.", u.id, act.item.v.id, act.order.id))
				return
			}
			v = act.newV
			c.assistant(fmt.Sprintf("It looks like that variant is out of stock. The closest available option is item %s (%s) at %s, which means %s. Would you like that one instead?",
				v.id, v.describe(), money(v.price), diffText(act, v)))
			c.user(pick(rng, []string{"Yes, that one is fine.", "Yes, let's do that one.", "Yes please, that works."}))
			rec.confirmed = true
		}
		fake := ""
		if i == fab && ep.lacking(ArgumentGrounding) {
			fake = ep.fabricate(func() string { return digits(rng, 10) })
			rec.grounded = false
		}
		args := rt.args(act, act.pay, fake, v)
		ep.write("", callSpec{name: act.tool(), args: args, result: rt.result(act, args, u, v)}, rec)
		done = append(done, act)
	}

	ep.conclude("Done!", len(done), func(i int) (s, w string) {
		act := done[i]
		switch act.kind {
		case "cancel":
			f := "Order %s has been cancelled, and the refund of %s will go back to your %s in 5 to 7 business days."
			s = fmt.Sprintf(f, act.order.id, money(act.order.total()), u.payName(act.order.payID))
			w = fmt.Sprintf(f, act.order.id, money(act.order.total()+10), u.payName(act.order.payID))
			if i == 0 {
				ep.final.fact = "refund of " + money(act.order.total())
			}
		case "address":
			f := "The shipping address of order %s is now %s."
			s = fmt.Sprintf(f, act.order.id, act.addr)
			w = fmt.Sprintf(f, act.order.id, u.addr)
			if i == 0 {
				ep.final.fact = "new address " + act.addr.line1
			}
		case "return":
			f := "The return of the %s from order %s is requested; you'll get %s back on your %s once we receive it. You'll find the return label in your email."
			s = fmt.Sprintf(f, act.item.prod.name, act.order.id, money(act.item.v.price), u.payName(act.pay))
			w = fmt.Sprintf(f, act.item.prod.name, act.order.id, money(act.item.v.price+10), u.payName(act.pay))
			if i == 0 {
				ep.final.fact = "refund of " + money(act.item.v.price)
			}
		case "exchange":
			f := "The exchange of your %s for item %s in order %s is requested, with %s."
			s = fmt.Sprintf(f, act.item.prod.name, act.newV.id, act.order.id, diffText(act, act.newV))
			w = fmt.Sprintf(f, act.item.prod.name, act.newV.id, act.order.id, fmt.Sprintf("a price difference of %s", money(abs(diff(act, act.newV))+10)))
			if i == 0 {
				ep.final.fact = "price difference of " + money(abs(diff(act, act.newV)))
			}
		}
		return s, w
	})
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// args are the arguments of an action's write call; fake, when set,
// replaces the identifier the agent should have taken from the
// conversation (the returned item id, or the new item id of an exchange).
func (rt *retail) args(act *retailAct, pay, fake string, v *variant) map[string]any {
	switch act.kind {
	case "cancel":
		return map[string]any{"order_id": act.order.id, "reason": "no longer needed"}
	case "address":
		a := act.addr
		return map[string]any{"order_id": act.order.id, "address1": a.line1, "address2": a.line2, "city": a.city, "state": a.state, "country": a.country, "zip": a.zip}
	case "return":
		item := act.item.v.id
		if fake != "" {
			item = fake
		}
		return map[string]any{"order_id": act.order.id, "item_ids": []any{item}, "payment_method_id": pay}
	case "exchange":
		nv := v.id
		if fake != "" {
			nv = fake
		}
		return map[string]any{"order_id": act.order.id, "item_ids": []any{act.item.v.id}, "new_item_ids": []any{nv}, "payment_method_id": pay}
	}
	panic("simulate: unknown retail action " + act.kind)
}

func (rt *retail) result(act *retailAct, args map[string]any, u *retailUser, v *variant) string {
	o := *act.order
	switch act.kind {
	case "cancel":
		return o.json(u.id, kv{"status", "cancelled"}, kv{"cancel_reason", "no longer needed"})
	case "address":
		o.addr = act.addr
		return o.json(u.id)
	case "return":
		return o.json(u.id, kv{"status", "return requested"}, kv{"return_items", args["item_ids"]}, kv{"return_payment_method_id", args["payment_method_id"]})
	case "exchange":
		return o.json(u.id, kv{"status", "exchange requested"}, kv{"exchange_items", args["item_ids"]}, kv{"exchange_new_items", args["new_item_ids"]},
			kv{"exchange_payment_method_id", args["payment_method_id"]}, kv{"exchange_price_difference", round2(v.price - act.item.v.price)})
	}
	panic("simulate: unknown retail action " + act.kind)
}
