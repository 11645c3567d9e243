package envprog

import (
	"math"
	"strings"
	"testing"

	"go.starlark.net/starlark"
)

func TestJSONRoundTrip(t *testing.T) {
	cases := []struct{ in, out string }{
		{`{"b": 1, "a": [true, false, null], "c": {"d": -2.5e3}}`, `{"b":1,"a":[true,false,null],"c":{"d":-2500.0}}`},
		{`"é\u00e9\n\"\\\u0001"`, `"éé\n\"\\\u0001"`},
		{`123456789012345678901234567890`, `123456789012345678901234567890`},
		{`1.0`, `1.0`},
		{`0.1`, `0.1`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{` [ 1 , "x" ] `, `[1,"x"]`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\ud83d x"`, "\"\ufffd x\""},
		{`"a\/b\b\f\r\t"`, `"a/b\u0008\u000c\r\t"`},
	}
	for _, c := range cases {
		v, err := fromJSON([]byte(c.in))
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		b, err := toJSON(v)
		if err != nil || string(b) != c.out {
			t.Errorf("%s: got %s %v, want %s", c.in, b, err, c.out)
		}
	}
	for _, bad := range []string{`{"a":}`, `[1,]`, `{"a" 1}`, `tru`, `"x`, `01`, `1.`, `{"a":1}x`, "\"\x01\"", `{1:2}`, "\"\xff\""} {
		if _, err := fromJSON([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := fromJSON([]byte(strings.Repeat("[", 600) + strings.Repeat("]", 600))); err == nil {
		t.Error("600 levels of nesting parsed")
	}
}

func TestToJSONRejects(t *testing.T) {
	l := starlark.NewList(nil)
	_ = l.Append(l)
	d := starlark.NewDict(1)
	_ = d.SetKey(starlark.MakeInt(1), starlark.None)
	for _, v := range []starlark.Value{l, d, starlark.Float(math.NaN()), starlark.NewSet(0)} {
		if b, err := toJSON(v); err == nil {
			t.Errorf("%v encoded as %s", v, b)
		}
	}
	if b, _ := toJSON(starlark.String("bad\xffutf8")); string(b) != `"bad\ufffdutf8"` {
		t.Errorf("invalid UTF-8 encoded as %s", b)
	}
}

func TestDeepCopy(t *testing.T) {
	inner := starlark.NewList([]starlark.Value{starlark.MakeInt(1)})
	d := starlark.NewDict(2)
	_ = d.SetKey(starlark.String("a"), inner)
	_ = d.SetKey(starlark.String("b"), inner) // aliased
	_ = d.SetKey(starlark.String("t"), starlark.Tuple{inner})
	self := starlark.NewList(nil)
	_ = self.Append(self) // a cycle
	_ = d.SetKey(starlark.String("self"), self)
	d.Freeze()
	v, err := deepCopy(d)
	if err != nil {
		t.Fatal(err)
	}
	c := v.(*starlark.Dict)
	a, _, _ := c.Get(starlark.String("a"))
	b, _, _ := c.Get(starlark.String("b"))
	if a == starlark.Value(inner) || a != b {
		t.Error("the copy shares the original list, or lost the aliasing")
	}
	if err := a.(*starlark.List).Append(starlark.MakeInt(2)); err != nil {
		t.Errorf("the copy is frozen: %v", err)
	}
	if inner.Len() != 1 {
		t.Error("appending to the copy changed the original")
	}
	s, _, _ := c.Get(starlark.String("self"))
	if s.(*starlark.List).Index(0) != s {
		t.Error("the cycle was not copied as a cycle")
	}
}
