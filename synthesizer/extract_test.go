package synthesizer

import (
	"errors"
	"strings"
	"testing"
)

const tinyProgram = `"""Rationale."""

def tools():
    return []

def reset(seed):
    return {"system": "s", "user": "u", "state": {}}

def step(state, call):
    return {"result": "", "state": state, "done": True}

def reward(state, transcript):
    return {"reward": 0.0, "components": {}}
`

func TestExtractProgram(t *testing.T) {
	tests := []struct {
		name, answer string
		want         string // substring of the program
		notWant      string
	}{
		{"python fence", "Here it is:\n```python\n" + tinyProgram + "```\nGood luck.", "def reward(state", "Good luck"},
		{"starlark fence", "```starlark\n" + tinyProgram + "```", "def tools():", "```"},
		{"bare fence", "```\n" + tinyProgram + "```", "def step(", "```"},
		{"tilde fence", "~~~py\n" + tinyProgram + "~~~", "def reset(", "~~~"},
		{"crlf", strings.ReplaceAll("```python\n"+tinyProgram+"```", "\n", "\r\n"), "def reset(seed):\n", "\r"},
		{"unterminated fence (cut at max_tokens)", "```python\n" + tinyProgram[:strings.Index(tinyProgram, "def reward")], "def step(", "```"},
		{"unfenced with prose before", "Sure! The environment follows.\n\n" + tinyProgram, `"""Rationale."""`, "Sure!"},
		{"unfenced starting with def", tinyProgram[strings.Index(tinyProgram, "def tools"):], "def tools", ""},
		{"the block with the program among others", "Tools:\n```json\n[{\"type\": \"function\"}]\n```\nProgram:\n```python\n" + tinyProgram + "```", "def reset", "\"type\""},
		{"last complete block wins a tie", "```python\n" + strings.Replace(tinyProgram, "0.0", "0.1", 1) + "```\nFixed:\n```python\n" + tinyProgram + "```", `"reward": 0.0`, `"reward": 0.1`},
		{"fence indented in a list item", "1. The program:\n\n   ```python\n" + indent(tinyProgram, "   ") + "   ```\n2. Run it.", "\ndef reward(state, transcript):\n    return", "Run it"},
		{"tab-indented fence", "\t```python\n" + indent(tinyProgram, "\t") + "\t```", "\ndef step(state, call):\n    return", ""},
		{"a longer fence holds a shorter one", "````python\n" + strings.Replace(tinyProgram, `"""Rationale."""`, "\"\"\"Rationale.\n\nReply like:\n```\nok\n```\n\"\"\"", 1) + "````\nDone.",
			"Reply like:\n```\nok\n```\n\"\"\"\n\ndef tools", "Done."},
		{"a fuller block beats a partial one", "```python\n" + tinyProgram + "```\nand the helper:\n```python\ndef reward(state, transcript):\n    return 1\n```", "def tools", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ExtractProgram(tt.answer)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(got, tt.want) || (tt.notWant != "" && strings.Contains(got, tt.notWant)) {
				t.Fatalf("extracted:\n%s", got)
			}
			if !strings.HasSuffix(got, "\n") || strings.HasSuffix(got, "\n\n") {
				t.Fatalf("program should end in exactly one newline: %q", got[max(0, len(got)-10):])
			}
		})
	}
}

// indent prefixes every non-empty line of s with p.
func indent(s, p string) string {
	ls := strings.Split(s, "\n")
	for i, l := range ls {
		if l != "" {
			ls[i] = p + l
		}
	}
	return strings.Join(ls, "\n")
}

func TestExtractProgramNone(t *testing.T) {
	tests := []struct{ name, answer, reason string }{
		{"empty", "  \n ", "empty"},
		{"prose", "I cannot write this environment, sorry.", "no code block"},
		{"json block only", "```json\n{\"a\": 1}\n```", "code blocks define none"},
		{"code without the contract", "```python\ndef helper():\n    return 1\n```", "code blocks define none"},
		{"gibberish of a base model", "<start_of_turn>model\nthe the the environment environment", "no code block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ExtractProgram(tt.answer)
			if !errors.Is(err, ErrNoProgram) || !strings.Contains(err.Error(), tt.reason) {
				t.Fatalf("err %v, want ErrNoProgram with %q", err, tt.reason)
			}
		})
	}
}
