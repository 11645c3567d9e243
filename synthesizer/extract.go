package synthesizer

import (
	"errors"
	"regexp"
	"strings"
)

// ErrNoProgram is wrapped by ExtractProgram when an answer holds no program.
var ErrNoProgram = errors.New("the answer contains no program")

// contractFuncs are the functions every program must define; a code block
// that defines none of them is not the program.
var contractFuncs = []string{"tools", "reset", "step", "reward"}

var (
	// fenceRe matches an opening fence line: ``` or ~~~ with an optional
	// info string (python, starlark, py, star, bzl, or anything else).
	fenceRe = regexp.MustCompile("^[ \t]*(```+|~~~+)[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$")
	defRe   = regexp.MustCompile(`(?m)^def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(`)
	// codeStartRe is a line that can begin a Starlark module: a docstring,
	// a def, a load, a comment or an assignment at column 0.
	codeStartRe = regexp.MustCompile(`^("""|'''|def[ \t]|load\(|#|[A-Za-z_][A-Za-z0-9_]*[ \t]*=[^=])`)
)

// ExtractProgram finds the Starlark program in a model's answer. It accepts
// the program in a fenced block (```python, ```starlark, ```py, a bare ```,
// or ~~~; indented in a list item, or in a longer fence around code that
// holds ``` lines), several blocks (the one defining most contract
// functions wins, the last on a tie — a model that corrects itself puts the
// fix last), an
// unterminated fence (an answer cut at max_tokens), or no fence at all (the
// code from its first line that can start a module). An answer whose code
// defines none of tools, reset, step and reward has no program: the error
// wraps ErrNoProgram and says what the answer looked like.
func ExtractProgram(answer string) (string, error) {
	answer = strings.ReplaceAll(answer, "\r\n", "\n")
	if strings.TrimSpace(answer) == "" {
		return "", errorf(ErrNoProgram, "the answer is empty")
	}
	blocks, fenced := fencedBlocks(answer)
	best, bestScore := "", 0
	for _, b := range blocks {
		if s := contractScore(b); s > 0 && s >= bestScore {
			best, bestScore = b, s
		}
	}
	if best != "" {
		return strings.TrimSpace(best) + "\n", nil
	}
	if !fenced {
		if code := unfenced(answer); contractScore(code) > 0 {
			return strings.TrimSpace(code) + "\n", nil
		}
	}
	what := "no code block and no def of " + strings.Join(contractFuncs, ", ")
	if fenced {
		what = "its code blocks define none of " + strings.Join(contractFuncs, ", ")
	}
	return "", errorf(ErrNoProgram, "%s (answer begins %q)", what, cut(strings.TrimSpace(answer), 120))
}

// fencedBlocks returns the contents of every fenced block, and whether the
// answer had any fence. As in CommonMark, a block is closed only by a fence
// of its own character at least as long as its opening one (a ```` block
// may hold ``` lines), and the opening fence's indentation (a block in a
// list item) is removed from its lines.
func fencedBlocks(s string) (blocks []string, fenced bool) {
	lines := strings.Split(s, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRe.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		fenced = true
		marker := m[1]
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " \t"))
		var body []string
		j := i + 1
		for ; j < len(lines); j++ {
			if t := strings.TrimSpace(lines[j]); strings.HasPrefix(t, marker) && strings.Trim(t, marker[:1]) == "" {
				break
			}
			body = append(body, dedent(lines[j], indent))
		}
		blocks = append(blocks, strings.Join(body, "\n")) // an unterminated fence runs to the end
		i = j
	}
	return blocks, fenced
}

// dedent removes up to n leading spaces and tabs from l.
func dedent(l string, n int) string {
	p := l[:min(n, len(l))]
	return l[len(p)-len(strings.TrimLeft(p, " \t")):]
}

// unfenced cuts leading prose off an answer without fences: the program
// starts at its first line that can begin a module.
func unfenced(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if codeStartRe.MatchString(l) {
			return strings.Join(lines[i:], "\n")
		}
	}
	return ""
}

// contractScore counts the contract functions code defines at top level.
func contractScore(code string) int {
	defs := map[string]bool{}
	for _, m := range defRe.FindAllStringSubmatch(code, -1) {
		defs[m[1]] = true
	}
	n := 0
	for _, f := range contractFuncs {
		if defs[f] {
			n++
		}
	}
	return n
}

// DefinedFunctions lists the top-level functions a program defines, in order.
func DefinedFunctions(code string) []string {
	var out []string
	for _, m := range defRe.FindAllStringSubmatch(code, -1) {
		out = append(out, m[1])
	}
	return out
}

func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
