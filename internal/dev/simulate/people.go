package simulate

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

var firstNames = []string{
	"Emma", "Raj", "Aarav", "Amelia", "Yusuf", "Mei", "Olivia", "Noah", "Sofia", "Liam", "Isabella", "Ethan",
	"Fatima", "Lucas", "Chen", "Mia", "Omar", "Harper", "Daiki", "Ava", "Mateo", "Chloe", "Ivan", "Zara",
	"Juan", "Lei", "Anya", "Evelyn", "Sophia", "James", "Aisha", "Mohamed", "Yara", "Lucas", "Ines", "Kenji",
}

var lastNames = []string{
	"Kim", "Santos", "Rossi", "Silva", "Taylor", "Nguyen", "Patel", "Garcia", "Muller", "Ahmed", "Johnson",
	"Lopez", "Ito", "Brown", "Khan", "Wilson", "Martin", "Sanchez", "Davis", "Moore", "Anderson", "Thomas",
	"Jackson", "White", "Harris", "Clark", "Lewis", "Walker", "Hall", "Young", "Li", "Wright", "Hernandez",
}

type address struct {
	line1, line2, city, state, country, zip string
}

var cities = []struct{ city, state, zip string }{
	{"Seattle", "WA", "98157"}, {"New York", "NY", "10125"}, {"Austin", "TX", "78712"}, {"Denver", "CO", "80218"},
	{"Chicago", "IL", "60651"}, {"San Francisco", "CA", "94128"}, {"Phoenix", "AZ", "85025"}, {"Boston", "MA", "02112"},
	{"Charlotte", "NC", "28204"}, {"Columbus", "OH", "43228"}, {"Portland", "OR", "97219"}, {"Philadelphia", "PA", "19122"},
	{"San Diego", "CA", "92190"}, {"Houston", "TX", "77013"}, {"Dallas", "TX", "75243"}, {"Jacksonville", "FL", "32229"},
}

var streets = []string{
	"Lakeview Drive", "Maple Drive", "Hillcrest Drive", "Main Street", "Willow Lane", "Cedar Avenue", "Elm Street",
	"Pine Lane", "River Road", "Oak Street", "Sunset Drive", "Park Avenue", "Spruce Street", "Highland Avenue",
}

func newAddress(rng *rand.Rand) address {
	c := pick(rng, cities)
	return address{
		line1:   fmt.Sprintf("%d %s", 100+rng.IntN(900), pick(rng, streets)),
		line2:   fmt.Sprintf("Suite %d", 100+rng.IntN(900)),
		city:    c.city,
		state:   c.state,
		country: "USA",
		zip:     c.zip,
	}
}

func (a address) json() obj {
	return obj{{"address1", a.line1}, {"address2", a.line2}, {"city", a.city}, {"country", a.country}, {"state", a.state}, {"zip", a.zip}}
}

func (a address) String() string {
	return fmt.Sprintf("%s, %s, %s, %s %s, %s", a.line1, a.line2, a.city, a.state, a.zip, a.country)
}

type person struct {
	first, last string
	dob         string
}

func newPerson(rng *rand.Rand) person {
	return person{
		first: pick(rng, firstNames),
		last:  pick(rng, lastNames),
		dob:   fmt.Sprintf("%d-%02d-%02d", 1950+rng.IntN(55), 1+rng.IntN(12), 1+rng.IntN(28)),
	}
}

func (p person) userID(rng *rand.Rand) string {
	return strings.ToLower(p.first) + "_" + strings.ToLower(p.last) + "_" + digits(rng, 4)
}

func (p person) name() string { return p.first + " " + p.last }

// typo returns s with two of its last three characters swapped, or with its
// last digit changed when those are equal.
func typo(s string) string {
	b := []byte(s)
	n := len(b)
	if n >= 2 && b[n-1] != b[n-2] {
		b[n-1], b[n-2] = b[n-2], b[n-1]
		return string(b)
	}
	if b[n-1] >= '0' && b[n-1] <= '9' {
		b[n-1] = '0' + (b[n-1]-'0'+3)%10
		return string(b)
	}
	return s + "x"
}
