package router

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseUsage(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		name string
		body string
		want Usage
		ok   bool
	}{
		{"OpenAI completion",
			`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":64}}}`,
			Usage{120, 7}, true},
		{"vLLM: fields after the usage",
			`{"id":"c","choices":[],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`,
			Usage{9, 3}, true},
		{"llama.cpp: timings after the usage",
			`{"choices":[],"created":1,"model":"m","usage":{"completion_tokens":40,"prompt_tokens":300,"total_tokens":340},"id":"chatcmpl-x","timings":{"prompt_n":300,"prompt_ms":85.2,"predicted_n":40}}`,
			Usage{300, 40}, true},
		{"spaces and new lines (Ollama, pretty-printed)",
			"{\n  \"choices\": [],\n  \"usage\" :\n  {\n    \"prompt_tokens\": 5,\n    \"completion_tokens\": 6\n  }\n}\n",
			Usage{5, 6}, true},
		{"stream with include_usage: nulls, then the usage chunk",
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
			Usage{11, 2}, true},
		{"vLLM continuous usage: the last running total",
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":1}}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
			Usage{11, 2}, true},
		{"a stream without usage", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", Usage{}, false},
		{"a null usage only", `{"choices":[],"usage":null}`, Usage{}, false},
		{"the word in the content is escaped, not a key",
			`{"choices":[{"message":{"content":"see \"usage\": {\"prompt_tokens\": 999}"}}]}`, Usage{}, false},
		{"content quoting a usage before the real one",
			`{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":999}"}}],"usage":{"prompt_tokens":4,"completion_tokens":1}}`,
			Usage{4, 1}, true},
		{"a key ending in usage is not usage", `{"usage_note":{"prompt_tokens":3},"x":{"my_usage":{"prompt_tokens":3}}}`, Usage{}, false},
		{"cut off inside the object", `{"usage":{"prompt_tokens":12,"completion_tok`, Usage{}, false},
		{"an object without counts", `{"usage":{"total_tokens":12}}`, Usage{}, false},
		{"one count only", `{"usage":{"completion_tokens":12}}`, Usage{}, false},
		{"counts of the wrong type", `{"usage":{"prompt_tokens":"12","completion_tokens":3}}`, Usage{}, false},
		{"a negative count", `{"usage":{"prompt_tokens":-1,"completion_tokens":3}}`, Usage{}, false},
		{"a fraction", `{"usage":{"prompt_tokens":1.5,"completion_tokens":3}}`, Usage{}, false},
		{"an exponent", `{"usage":{"prompt_tokens":1e3,"completion_tokens":3}}`, Usage{}, false},
		{"a count past uint32 is clamped", `{"usage":{"prompt_tokens":99999999999,"completion_tokens":3}}`, Usage{4294967295, 3}, true},
		{"a nested object's counts are not the usage's", `{"usage":{"details":{"prompt_tokens":7,"completion_tokens":8},"total_tokens":15}}`, Usage{}, false},
		{"a string value that looks like a name", `{"usage":{"kind":"prompt_tokens","prompt_tokens":2,"completion_tokens":1}}`, Usage{2, 1}, true},
		{"an earlier complete usage when the last is cut", `{"usage":{"prompt_tokens":3,"completion_tokens":4}}` + "\n" + `{"usage":{"prompt_tokens":1`, Usage{3, 4}, true},
		{"braces and quotes inside a string value", `{"usage":{"note":"}{\"","prompt_tokens":8,"completion_tokens":9}}`, Usage{8, 9}, true},
		{"a long completion: only the end is kept", `{"choices":[{"message":{"content":"` + long + `"}}],"usage":{"prompt_tokens":1,"completion_tokens":1250}}`,
			Usage{1, 1250}, true},
		{"usage before a long body is not in the tail", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[{"message":{"content":"` + long + `"}}]}`,
			Usage{}, false},
		{"empty", ``, Usage{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The body arrives in reads of 7 bytes and keepTail keeps its end,
			// as copyFlush does.
			tail := make([]byte, 0, usageTail)
			for b := []byte(tc.body); len(b) > 0; b = b[min(7, len(b)):] {
				tail = keepTail(tail, b[:min(7, len(b))])
			}
			got, ok := parseUsage(tail)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("parseUsage = %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestKeepTail(t *testing.T) {
	body := make([]byte, 3*usageTail+123)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	for _, read := range []int{1, 100, usageTail - 1, usageTail, usageTail + 1, len(body)} {
		tail := make([]byte, 0, usageTail)
		for b := body; len(b) > 0; b = b[min(read, len(b)):] {
			tail = keepTail(tail, b[:min(read, len(b))])
			if cap(tail) != usageTail {
				t.Fatalf("reads of %d: the tail grew to %d", read, cap(tail))
			}
		}
		if !bytes.Equal(tail, body[len(body)-usageTail:]) {
			t.Fatalf("reads of %d: the tail is not the body's last %d bytes", read, usageTail)
		}
	}
	if tail := keepTail(make([]byte, 0, usageTail), []byte("short")); string(tail) != "short" {
		t.Fatalf("a short body's tail %q", tail)
	}
}

func TestCopyFlushSeesErrorEvents(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		sawError   bool
	}{
		{"vLLM's error event", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"CUDA out of memory\"}}\n\n", true},
		{"without the space after data:", "data:{\"error\":{\"message\":\"boom\"}}\n\n", true},
		{"an object of type error", "data: {\"object\":\"error\",\"message\":\"boom\"}\n\n", true},
		{"an object of type error, spaced", "data: {\"object\": \"error\", \"message\": \"boom\"}\n\n", true},
		{"the words in content", "data: {\"choices\":[{\"delta\":{\"content\":\"data: {\\\"error\\\" \\\"object\\\":\\\"error\\\"\"}}]}\n\ndata: [DONE]\n\n", false},
		{"a clean stream", "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n", false},
		// llama.cpp's server before mid-2025 (server_sent_event(sink, "error", …)):
		// an "error" field, then its [DONE].
		{"llama.cpp's error field", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\nerror: {\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}\n\ndata: [DONE]\n\n", true},
		{"llama.cpp's error field first", "error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"exceed_context_size_error\"}\n\ndata: [DONE]\n\n", true},
		{"llama.cpp's error field after CRLF", "data: {\"choices\":[]}\r\n\r\nerror:{\"code\":500}\r\n\r\n", true},
		{"error: in content", "data: {\"choices\":[{\"delta\":{\"content\":\"x\\nerror: y\"}}]}\n\ndata: [DONE]\n\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read: every pattern is split across reads.
			w := httptest.NewRecorder()
			c := copyFlush(w, iotest.OneByteReader(strings.NewReader(tc.body)), true, true)
			if c.err != nil || c.sawError != tc.sawError || w.Body.String() != tc.body {
				t.Fatalf("copyFlush: err %v, sawError %v (want %v), copied %q", c.err, c.sawError, tc.sawError, w.Body.String())
			}
		})
	}
}

func TestParseUsageAllocatesNothing(t *testing.T) {
	body := []byte(`{"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":64}},"x":null}`)
	if n := testing.AllocsPerRun(100, func() {
		if u, ok := parseUsage(body); !ok || u.PromptTokens != 120 {
			t.Fatal(u, ok)
		}
	}); n != 0 {
		t.Fatalf("parseUsage allocates %v times per call", n)
	}
}
