package envprog

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"go.starlark.net/starlark"
)

// The predeclared rand(seed) of environment programs.
//
// Only PCG's Uint64 (a fixed, documented algorithm: 128-bit LCG with the
// DXSM output function) comes from math/rand/v2; every derived draw
// (bounded integers, floats, shuffles, samples) is computed here, so a
// program's instances never change with the Go version.

// pcgIncrement is the second PCG seed word; the program's seed is the first.
const pcgIncrement = 0x9e3779b97f4a7c15

// rng is a Starlark value with methods randint, random, choice, sample and
// shuffle. A frozen rng (one made at module level) refuses to draw: a
// module is shared by every episode, so drawing from it would make
// instances depend on the order in which episodes ran.
type rng struct {
	pcg    rand.PCG
	frozen bool
	// methods are the bound methods, made on first use: a program draws
	// hundreds of times per reset, and binding a method allocates.
	methods [5]*starlark.Builtin
}

var rngMethods = [5]string{"randint", "random", "choice", "sample", "shuffle"}

var _ starlark.HasAttrs = (*rng)(nil)

func newRand(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var seed starlark.Int
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &seed); err != nil {
		return nil, err
	}
	s, ok := seed.Int64()
	if !ok {
		return nil, fmt.Errorf("rand: seed %v does not fit in 64 bits", seed)
	}
	r := &rng{}
	r.pcg.Seed(uint64(s), pcgIncrement)
	return r, nil
}

func (r *rng) String() string        { return "<rand>" }
func (r *rng) Type() string          { return "rand" }
func (r *rng) Freeze()               { r.frozen = true }
func (r *rng) Truth() starlark.Bool  { return true }
func (r *rng) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: rand") }
func (r *rng) AttrNames() []string {
	return []string{"choice", "randint", "random", "sample", "shuffle"}
}

func (r *rng) Attr(name string) (starlark.Value, error) {
	i := 0
	for i < len(rngMethods) && rngMethods[i] != name {
		i++
	}
	if i == len(rngMethods) {
		return nil, nil
	}
	if m := r.methods[i]; m != nil {
		return m, nil
	}
	var fn func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error)
	switch i {
	case 0:
		fn = r.randint
	case 1:
		fn = r.random
	case 2:
		fn = r.choice
	case 3:
		fn = r.sample
	default:
		fn = r.shuffle
	}
	m := starlark.NewBuiltin(name, fn).BindReceiver(r)
	if !r.frozen { // a frozen rng is shared by goroutines: never write to it
		r.methods[i] = m
	}
	return m, nil
}

func (r *rng) check(name string) error {
	if r.frozen {
		return fmt.Errorf("rand.%s: this rand was made at top level and is frozen; make it in reset(seed) with rand(seed)", name)
	}
	return nil
}

// below returns a uniform integer in [0, n) (Lemire's nearly divisionless
// method with rejection), n > 0.
func (r *rng) below(n uint64) uint64 {
	hi, lo := bits.Mul64(r.pcg.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.pcg.Uint64(), n)
		}
	}
	return hi
}

func (r *rng) randint(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := r.check(b.Name()); err != nil {
		return nil, err
	}
	var lo, hi int64
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &lo, &hi); err != nil {
		return nil, err
	}
	if hi < lo {
		return nil, fmt.Errorf("randint: empty range [%d, %d]", lo, hi)
	}
	span := uint64(hi - lo)
	if span == math.MaxUint64 {
		return starlark.MakeInt64(int64(r.pcg.Uint64())), nil
	}
	return starlark.MakeInt64(lo + int64(r.below(span+1))), nil
}

func (r *rng) random(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := r.check(b.Name()); err != nil {
		return nil, err
	}
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 0); err != nil {
		return nil, err
	}
	return starlark.Float(float64(r.pcg.Uint64()>>11) / (1 << 53)), nil
}

func seqElems(name string, v starlark.Value) ([]starlark.Value, error) {
	it, ok := v.(starlark.Iterable)
	if !ok {
		return nil, fmt.Errorf("%s: got %s, want a sequence", name, v.Type())
	}
	if _, isDict := v.(*starlark.Dict); isDict {
		return nil, fmt.Errorf("%s: got dict, want a sequence (use list(d.keys()))", name)
	}
	var out []starlark.Value
	if s, ok := v.(starlark.Sequence); ok {
		out = make([]starlark.Value, 0, s.Len())
	}
	iter := it.Iterate()
	defer iter.Done()
	var x starlark.Value
	for iter.Next(&x) {
		out = append(out, x)
	}
	return out, nil
}

func (r *rng) choice(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := r.check(b.Name()); err != nil {
		return nil, err
	}
	var seq starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &seq); err != nil {
		return nil, err
	}
	if s, ok := seq.(starlark.Indexable); ok {
		if s.Len() == 0 {
			return nil, fmt.Errorf("choice: empty sequence")
		}
		return s.Index(int(r.below(uint64(s.Len())))), nil
	}
	elems, err := seqElems("choice", seq)
	if err != nil {
		return nil, err
	}
	if len(elems) == 0 {
		return nil, fmt.Errorf("choice: empty sequence")
	}
	return elems[r.below(uint64(len(elems)))], nil
}

// permute shuffles elems in place (Fisher–Yates from the end).
func (r *rng) permute(elems []starlark.Value) {
	for i := len(elems) - 1; i > 0; i-- {
		j := r.below(uint64(i + 1))
		elems[i], elems[j] = elems[j], elems[i]
	}
}

func (r *rng) shuffle(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := r.check(b.Name()); err != nil {
		return nil, err
	}
	var seq starlark.Value
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &seq); err != nil {
		return nil, err
	}
	elems, err := seqElems("shuffle", seq)
	if err != nil {
		return nil, err
	}
	r.permute(elems)
	return starlark.NewList(elems), nil
}

func (r *rng) sample(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := r.check(b.Name()); err != nil {
		return nil, err
	}
	var seq starlark.Value
	var k int
	if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &seq, &k); err != nil {
		return nil, err
	}
	elems, err := seqElems("sample", seq)
	if err != nil {
		return nil, err
	}
	if k < 0 || k > len(elems) {
		return nil, fmt.Errorf("sample: k=%d is outside [0, %d]", k, len(elems))
	}
	// Partial Fisher–Yates from the front: the first k are a uniform sample
	// in a uniform order.
	for i := 0; i < k; i++ {
		j := i + int(r.below(uint64(len(elems)-i)))
		elems[i], elems[j] = elems[j], elems[i]
	}
	return starlark.NewList(elems[:k:k]), nil
}

// copy returns an unfrozen rng with the same position in its stream.
func (r *rng) copy() *rng { return &rng{pcg: r.pcg} }
