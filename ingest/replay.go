package ingest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/schollz/progressbar/v3"
	"github.com/segmentio/kafka-go"
	"golang.org/x/term"

	"github.com/traceops/trace/schemas"
)

// Input formats of Replay.
const (
	FormatAuto         = "auto"          // see DetectFormat
	FormatRolloutJSONL = "rollout-jsonl" // one rollout/v1 JSON object per line
	FormatRolloutJSON  = "rollout-json"  // a JSON array of rollout/v1 objects, or one (indented) rollout object
	FormatTau2         = "tau2"          // a τ²-bench result file, converted with ConvertTau2
)

// ReplayFormats lists the accepted values of the format argument.
var ReplayFormats = []string{FormatAuto, FormatRolloutJSONL, FormatRolloutJSON, FormatTau2}

// ReasonTau2Invalid is the rejection reason of a τ² simulation that cannot
// even be decoded into the τ² shape (the other reasons are schemas.Reason*).
const ReasonTau2Invalid = "tau2_invalid"

// DefaultReplayTopic is the topic rollouts are published on.
const DefaultReplayTopic = "trace.rollouts"

// ReplayWriter publishes messages; *kafka.Writer implements it.
type ReplayWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// NewKafkaWriter returns a kafka-go Writer set up for replaying rollouts:
// zstd compression, the Hash balancer on the message key (rollout.Key(), so
// a cohort stays in one partition and in order), acks from all in-sync
// replicas, topic auto-creation, and batches of up to 1000 messages or 5 MiB
// (a rollout may be schemas.DefaultMaxBytes = 4 MiB) flushed after 20 ms.
//
// The broker's message.max.bytes (or the topic's max.message.bytes) must admit
// a compressed batch; JSON rollouts compress about 10x with zstd, so the
// Kafka default of 1 MB is usually enough, but rollouts close to 4 MiB need
// it raised. The caller closes the writer.
func NewKafkaWriter(brokers []string, topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:                   kafka.TCP(brokers...),
		Topic:                  topic,
		Balancer:               &kafka.Hash{},
		Compression:            kafka.Zstd,
		RequiredAcks:           kafka.RequireAll,
		BatchSize:              1000,
		BatchBytes:             int64(schemas.DefaultMaxBytes) + 1<<20,
		BatchTimeout:           20 * time.Millisecond,
		WriteTimeout:           30 * time.Second,
		AllowAutoTopicCreation: true,
	}
}

// Rejection is one input record that was not published.
type Rejection struct {
	File       string // base name of the input file
	Line       int    // 1-based line (rollout-jsonl) or simulation index (tau2)
	Simulation bool   // Line counts simulations, not lines
	Element    int    // 1-based element of a rollout-json array (Line is the line it starts on)
	RolloutID  string // when known
	Reason     string // schemas.Reason* or ReasonTau2Invalid
	Msg        string
}

func (r Rejection) String() string {
	var b strings.Builder
	b.WriteString(r.File)
	if r.Simulation {
		fmt.Fprintf(&b, " simulation %d", r.Line)
		if r.RolloutID != "" {
			fmt.Fprintf(&b, " (%s)", r.RolloutID)
		}
	} else {
		fmt.Fprintf(&b, ":%d", r.Line)
		if r.Element > 0 {
			fmt.Fprintf(&b, " (element %d)", r.Element)
		}
	}
	b.WriteString(": ")
	b.WriteString(r.Reason)
	if r.Msg != "" {
		b.WriteString(": ")
		b.WriteString(tau2Truncate(r.Msg, 300))
	}
	return b.String()
}

// Summary reports a replay.
type Summary struct {
	Files            int            // input files read (completely or until an error)
	Sent             int            // rollouts acknowledged by Kafka
	Rejected         int            // records that failed validation and were not published
	RejectedByReason map[string]int // Rejected by reason code
	FirstRejections  []Rejection    // the first few rejections, in input order
	Bytes            int64          // value bytes of the sent rollouts (before compression)
	Elapsed          time.Duration
	Rate             float64 // sent rollouts per second
}

// String renders the summary for a terminal, on one line plus one line per
// listed rejection.
func (s Summary) String() string {
	var b strings.Builder
	files := "files"
	if s.Files == 1 {
		files = "file"
	}
	fmt.Fprintf(&b, "sent %d rollouts (%s) from %d %s in %s", s.Sent, replayHumanBytes(s.Bytes), s.Files, files, s.Elapsed.Round(time.Millisecond))
	if s.Elapsed > 0 && s.Sent > 0 {
		fmt.Fprintf(&b, ", %.1f rollouts/s, %s/s", s.Rate, replayHumanBytes(int64(float64(s.Bytes)/s.Elapsed.Seconds())))
	}
	if s.Rejected == 0 {
		b.WriteString("; rejected 0")
		return b.String()
	}
	reasons := make([]string, 0, len(s.RejectedByReason))
	for r := range s.RejectedByReason {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	fmt.Fprintf(&b, "; rejected %d (", s.Rejected)
	for i, r := range reasons {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", r, s.RejectedByReason[r])
	}
	b.WriteString(")")
	for _, r := range s.FirstRejections {
		b.WriteString("\n  ")
		b.WriteString(r.String())
	}
	if n := s.Rejected - len(s.FirstRejections); n > 0 && len(s.FirstRejections) > 0 {
		fmt.Fprintf(&b, "\n  … and %d more", n)
	}
	return b.String()
}

// Replayer publishes rollout files to Kafka. The zero value is not usable:
// Writer is required.
type Replayer struct {
	Writer ReplayWriter
	// Format is one of ReplayFormats; "" means FormatAuto.
	Format string
	// Progress receives a progress bar when it is a terminal; otherwise
	// (a log file, a CI job) a progress line every ProgressEvery. nil
	// disables progress.
	Progress io.Writer
	// ProgressEvery is the interval of the progress lines written to a
	// Progress that is not a terminal (default 10s).
	ProgressEvery time.Duration
	// ChunkSize is the number of messages handed to one WriteMessages call
	// (default 1000). A chunk is also flushed once it holds 32 MiB.
	ChunkSize int
	// MaxBytes bounds one rollout (default schemas.DefaultMaxBytes).
	MaxBytes int
	// MaxExamples is the number of rejections kept in Summary.FirstRejections
	// (default 5).
	MaxExamples int
	// Stdin is read for the file "-" (default os.Stdin).
	Stdin io.Reader
}

// Replay publishes the rollouts of files on w (usually NewKafkaWriter) in
// the given format (FormatAuto, FormatRolloutJSONL or FormatTau2) and
// returns what happened. See Replayer.Replay.
func Replay(ctx context.Context, w ReplayWriter, files []string, format string, progress io.Writer) (Summary, error) {
	r := &Replayer{Writer: w, Format: format, Progress: progress}
	return r.Replay(ctx, files)
}

// Replay reads every file, validates each rollout as the ingest stage does
// (DecodeRollout) and publishes the valid ones keyed by rollout.Key(), in input order, in
// chunks of ChunkSize. Invalid records are counted in the summary by reason
// and not published; they are not an error. Blank JSONL lines are skipped.
//
// The error is non-nil when a file cannot be read or parsed as a whole (a
// forced tau2 format on another file, say) or when Kafka fails; Replay then
// stops, and the summary says what was sent before. Kafka errors that come
// before anything is written (the topic being auto-created, its leader not
// yet elected) are retried for a few seconds.
func (r *Replayer) Replay(ctx context.Context, files []string) (Summary, error) {
	start := time.Now()
	sum := Summary{RejectedByReason: map[string]int{}}
	finish := func(err error) (Summary, error) {
		sum.Elapsed = time.Since(start)
		if sum.Elapsed > 0 {
			sum.Rate = float64(sum.Sent) / sum.Elapsed.Seconds()
		}
		return sum, err
	}
	if r.Writer == nil {
		return finish(errors.New("replay: no writer"))
	}
	format := r.Format
	format = cmp.Or(format, FormatAuto)
	switch format {
	case FormatAuto, FormatRolloutJSONL, FormatRolloutJSON, FormatTau2:
	default:
		return finish(fmt.Errorf("replay: unknown format %q (want one of %s)", format, strings.Join(ReplayFormats, ", ")))
	}

	// Open every file first, so a typo fails before anything is published.
	var total int64
	srcs := make([]replaySource, 0, len(files))
	stdin := false
	for _, f := range files {
		if f == "-" {
			if stdin {
				return finish(errors.New(`standard input ("-") can be read only once`))
			}
			stdin = true
			in := cmp.Or[io.Reader](r.Stdin, os.Stdin)
			srcs = append(srcs, replaySource{name: f, open: func() (io.ReadCloser, error) { return io.NopCloser(in), nil }})
			total = -1
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return finish(err)
		}
		if fi.IsDir() {
			return finish(fmt.Errorf("%s is a directory", f))
		}
		src := replaySource{name: f, regular: fi.Mode().IsRegular(), open: func() (io.ReadCloser, error) { return os.Open(f) }}
		if src.regular {
			src.size = fi.Size()
			if total >= 0 {
				total += fi.Size()
			}
		} else { // a pipe, /dev/stdin: its size is not known
			total = -1
		}
		srcs = append(srcs, src)
	}

	run := &replayRun{Replayer: r, sum: &sum, ctx: ctx, total: total, start: start, lastLine: start}
	if r.Progress != nil && !replayIsTerminal(r.Progress) {
		run.lines = r.Progress
	}
	if r.Progress != nil && replayIsTerminal(r.Progress) {
		run.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(r.Progress),
			progressbar.OptionSetDescription("replay"),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
		)
		defer run.bar.Exit()
	}
	for _, src := range srcs {
		if err := ctx.Err(); err != nil {
			return finish(err)
		}
		ff := format
		if ff == FormatAuto {
			if !src.regular {
				// Telling the format reads the input's start, which a pipe
				// gives only once: it is copied to a file first.
				spooled, err := src.spool()
				if err != nil {
					return finish(err)
				}
				defer os.Remove(spooled.path)
				src = spooled
			}
			var err error
			if ff, err = DetectFormat(cmp.Or(src.path, src.name)); err != nil {
				return finish(err)
			}
		}
		if run.bar != nil {
			run.bar.Describe(src.base())
		}
		sum.Files++
		var err error
		switch ff {
		case FormatTau2:
			err = run.tau2(src)
		case FormatRolloutJSON:
			err = run.json(src)
		default:
			err = run.jsonl(src)
		}
		if err != nil {
			// A file that stops the replay (a syntax error, a τ² file
			// malformed as a whole) leaves the rollouts read before it
			// sent: they are queued, not yet written. (After a Kafka
			// error nothing is queued any more.)
			if ctx.Err() == nil {
				if ferr := run.flush(); ferr != nil {
					err = errors.Join(err, ferr)
				}
			}
			return finish(err)
		}
	}
	if err := run.flush(); err != nil {
		return finish(err)
	}
	if run.bar != nil {
		_ = run.bar.Finish()
	}
	return finish(nil)
}

// replaySource is one input of a replay: a file, or standard input ("-").
type replaySource struct {
	name    string // as given: a path, or "-"
	path    string // where it is read from, when not name (a copy of a pipe)
	regular bool   // a regular file (its start can be read twice)
	size    int64  // of a regular file (0: unknown)
	open    func() (io.ReadCloser, error)
}

// base names the input in rejections and the τ² metadata.
func (s replaySource) base() string {
	if s.name == "-" {
		return "stdin"
	}
	return filepath.Base(s.name)
}

// spool copies a pipe's input to a temporary file (removed by the caller)
// and returns the file as the source.
func (s replaySource) spool() (replaySource, error) {
	in, err := s.open()
	if err != nil {
		return s, err
	}
	defer in.Close()
	tmp, err := os.CreateTemp("", "trace-replay-*")
	if err != nil {
		return s, fmt.Errorf("%s: copying the input to tell its format: %w", s.name, err)
	}
	n, err := io.Copy(tmp, in)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return s, fmt.Errorf("%s: copying the input to tell its format: %w", s.name, err)
	}
	path := tmp.Name()
	return replaySource{name: s.name, path: path, regular: true, size: n,
		open: func() (io.ReadCloser, error) { return os.Open(path) }}, nil
}

// DetectFormat tells the formats apart (a UTF-8 byte order mark at the start
// is skipped): a file that is exactly one JSON object with a top-level
// "simulations" key is FormatTau2; a file whose first non-space byte is '['
// (an array of rollouts), or whose first JSON object spans several lines
// (indented rollouts, as jq prints them), is FormatRolloutJSON; anything
// else is FormatRolloutJSONL.
func DetectFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	if _, err := replaySkipBOM(br); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	for {
		c, err := br.ReadByte()
		if err != nil { // empty or all blank
			return FormatRolloutJSONL, nil
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		if c == '[' {
			return FormatRolloutJSON, nil
		}
		if c != '{' {
			return FormatRolloutJSONL, nil
		}
		_ = br.UnreadByte()
		break
	}
	// The first object, walked member by member (a τ² file is one object
	// of any size, not to be held in memory): a τ² file is one object with
	// a top-level "simulations" key, an indented rollout spans several
	// lines, a JSONL record one.
	lc := &replayLineCounter{r: br}
	dec := jsontext.NewDecoder(lc, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	sims, err := replayWalkObject(dec)
	if err != nil {
		return FormatRolloutJSONL, nil
	}
	multiline := lc.lines-bytes.Count(dec.UnreadBuffer(), []byte("\n")) > 0
	_, err = dec.ReadToken()
	alone := err == io.EOF // nothing but space follows
	if alone && sims {
		return FormatTau2, nil
	}
	if multiline {
		return FormatRolloutJSON, nil
	}
	return FormatRolloutJSONL, nil
}

// replayWalkObject reads the JSON object at dec's position and reports
// whether it has a member "simulations" at its top level. It holds no more
// than one member value, or one element of a member's array (or one member
// of its object), in memory at a time.
func replayWalkObject(dec *jsontext.Decoder) (sims bool, err error) {
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false, cmp.Or(err, errors.New("not an object"))
	}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return false, err
		}
		if tok.String() == "simulations" {
			sims = true
		}
		if err := replaySkipValue(dec); err != nil {
			return false, err
		}
	}
	_, err = dec.ReadToken()
	return sims, err
}

// replaySkipValue skips the next value, an array or object one element (or
// member) at a time: jsontext's SkipValue reads a large value token by
// token, several times slower than ReadValue, which holds the whole value.
func replaySkipValue(dec *jsontext.Decoder) error {
	kind := dec.PeekKind()
	if kind != '[' && kind != '{' {
		return dec.SkipValue()
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	for {
		switch dec.PeekKind() {
		case ']', '}':
			_, err := dec.ReadToken()
			return err
		}
		if kind == '{' {
			if _, err := dec.ReadToken(); err != nil { // the name
				return err
			}
		}
		if _, err := dec.ReadValue(); err != nil {
			return err
		}
	}
}

type replayRun struct {
	*Replayer
	ctx          context.Context
	sum          *Summary
	bar          *progressbar.ProgressBar
	lines        io.Writer // progress lines, when Progress is not a terminal
	total, done  int64     // input bytes: of every file, read so far
	start        time.Time
	lastLine     time.Time
	pending      []kafka.Message
	pendingBytes int64
}

func (r *replayRun) maxBytes() int {
	if r.MaxBytes > 0 {
		return r.MaxBytes
	}
	return schemas.DefaultMaxBytes
}

func (r *replayRun) reject(rj Rejection) {
	r.sum.Rejected++
	r.sum.RejectedByReason[rj.Reason]++
	keep := r.MaxExamples
	if keep <= 0 {
		keep = 5
	}
	if len(r.sum.FirstRejections) < keep {
		r.sum.FirstRejections = append(r.sum.FirstRejections, rj)
	}
}

func replayReason(err error) (reason, msg string) {
	var se *schemas.Error
	if errors.As(err, &se) {
		// Error() starts with the reason, which the summary prints already.
		msg = strings.TrimPrefix(err.Error(), se.Reason)
		return se.Reason, strings.TrimLeft(msg, ": ")
	}
	return schemas.ReasonSchema, err.Error()
}

// publish queues one validated rollout and flushes a full chunk.
func (r *replayRun) publish(key, value []byte, source string) error {
	r.pending = append(r.pending, kafka.Message{
		Key:     key,
		Value:   value,
		Headers: []kafka.Header{{Key: "source", Value: []byte(source)}},
	})
	r.pendingBytes += int64(len(value))
	chunk := r.ChunkSize
	if chunk <= 0 {
		chunk = 1000
	}
	if len(r.pending) >= chunk || r.pendingBytes >= 32<<20 {
		return r.flush()
	}
	return nil
}

// flush writes the pending chunk. Errors raised before anything was written
// (metadata: topic being created, leader not available) are retried with
// backoff; once batches were attempted, kafka-go has already retried them
// (Writer.MaxAttempts) and the error is returned with the successes counted.
func (r *replayRun) flush() error {
	if len(r.pending) == 0 {
		return nil
	}
	msgs := r.pending
	backoff := 100 * time.Millisecond
	var err error
	for attempt := 1; ; attempt++ {
		err = r.Writer.WriteMessages(r.ctx, msgs...)
		var kerr kafka.Error
		var werrs kafka.WriteErrors
		if err == nil || errors.As(err, &werrs) || !errors.As(err, &kerr) || !kerr.Temporary() || attempt >= 8 || r.ctx.Err() != nil {
			break
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(backoff):
		}
		if backoff *= 2; backoff > 2*time.Second {
			backoff = 2 * time.Second
		}
	}
	var werrs kafka.WriteErrors
	switch {
	case err == nil:
		r.sum.Sent += len(msgs)
		r.sum.Bytes += r.pendingBytes
	case errors.As(err, &werrs) && len(werrs) == len(msgs):
		for i, e := range werrs {
			if e == nil {
				r.sum.Sent++
				r.sum.Bytes += int64(len(msgs[i].Value))
			}
		}
		err = fmt.Errorf("kafka: %d of %d messages not written: %w", werrs.Count(), len(msgs), replayFirstError(werrs))
	default:
		err = fmt.Errorf("kafka: %d messages not written: %w", len(msgs), err)
	}
	r.pending = r.pending[:0:0]
	r.pendingBytes = 0
	return err
}

func replayFirstError(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return errors.New("unknown error")
}

func (r *replayRun) advance(n int64) {
	r.done += n
	if r.bar != nil && n > 0 {
		_ = r.bar.Add64(n)
	}
	if r.lines != nil && time.Since(r.lastLine) >= cmp.Or(r.ProgressEvery, 10*time.Second) {
		r.lastLine = time.Now()
		of := "" // the size of a pipe is not known
		if r.total >= 0 {
			pct := 100.0
			if r.total > 0 {
				pct = 100 * float64(r.done) / float64(r.total)
			}
			of = fmt.Sprintf(" of %s (%.0f%%)", replayHumanBytes(r.total), pct)
		}
		fmt.Fprintf(r.lines, "replay: %s%s read, %d rollouts sent, %d rejected, %s\n",
			replayHumanBytes(r.done), of, r.sum.Sent, r.sum.Rejected, time.Since(r.start).Round(time.Second))
	}
}

// replayItem is one input record after validation: either a message to
// publish (key, value) or a rejection.
type replayItem struct {
	key, value []byte
	source     string
	line       int  // 1-based line of a JSONL record (or where a rollout-json one starts)
	element    int  // 1-based element of a rollout-json array
	compact    bool // a rollout-json element: sent without its whitespace
	rej        *Rejection
	progress   int64 // input bytes this record accounts for
}

// replayBatch is the number of records validated concurrently before they
// are published, in input order.
const replayBatch = 256

// replayParallel runs fn(0..n-1) on GOMAXPROCS goroutines.
func replayParallel(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// emit publishes or rejects validated records in order.
func (r *replayRun) emit(items []replayItem) error {
	for i := range items {
		it := &items[i]
		r.advance(it.progress)
		if it.rej != nil {
			r.reject(*it.rej)
			continue
		}
		if it.value == nil { // blank line
			continue
		}
		if err := r.publish(it.key, it.value, it.source); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the records of batch as the ingest stage does (in
// parallel), then publishes or rejects them in order.
func (r *replayRun) validate(batch []replayItem, base string, decode func([]byte) (*schemas.Rollout, error)) error {
	replayParallel(len(batch), func(i int) {
		it := &batch[i]
		if it.rej != nil || it.value == nil {
			return
		}
		if it.compact { // the whitespace of an indented file is not sent
			if v := jsontext.Value(it.value); v.Compact() == nil {
				it.value = v
			}
		}
		ro, err := decode(it.value)
		if err != nil {
			reason, msg := replayReason(err)
			it.rej = &Rejection{File: base, Line: it.line, Element: it.element, Reason: reason, Msg: msg}
			it.value = nil
			return
		}
		it.key = []byte(ro.Key())
	})
	return r.emit(batch)
}

// json replays a file holding one JSON array of rollout/v1 objects, or
// rollout objects one after another, indented (as jq prints them). It is
// read one element at a time, so the file's size does not matter. Each
// element is sent without the whitespace between its tokens (strings and
// numbers as they are), and its size is checked after that. An element the
// ingest stage would dead-letter (schema, duplicate_key, invalid_utf8,
// too_large, ...) is rejected with its line and element number; a syntax
// error in the array itself (where the next element starts cannot be
// known) stops the file with an error naming its line, after the elements
// before it were published.
func (r *replayRun) json(src replaySource) error {
	path, base := src.name, src.base()
	f, br, bom, err := r.openText(src)
	if err != nil {
		return err
	}
	defer f.Close()
	lc := &replayLineCounter{r: br}
	// Duplicate names and invalid UTF-8 are the element's problem, named by
	// the ingest stage's decoder, not a reason to stop reading the file.
	dec := jsontext.NewDecoder(lc, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	// line is the line of the decoder's position (after the last value or
	// token read).
	line := func() int { return 1 + lc.lines - bytes.Count(dec.UnreadBuffer(), []byte("\n")) }
	fail := func(what string, err error) error {
		at := line()
		var se *jsontext.SyntacticError
		if errors.As(err, &se) {
			err = se.Err
			// The line of the error itself, in the bytes read ahead.
			if k, ub := se.ByteOffset-dec.InputOffset(), dec.UnreadBuffer(); k >= 0 && k <= int64(len(ub)) {
				at += bytes.Count(ub[:k], []byte("\n"))
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%s:%d: %s: %w", path, at, what, err)
	}
	limit := r.maxBytes()
	decode := DecodeRollout(limit) // the ingest stage's checks
	var offset int64               // input consumed, for the progress bar
	batch := make([]replayItem, 0, replayBatch)
	var batchBytes int
	flush := func() error {
		err := r.validate(batch, base, decode)
		batch, batchBytes = batch[:0], 0
		return err
	}
	array := false
	switch dec.PeekKind() {
	case '[':
		array = true
		if _, err := dec.ReadToken(); err != nil {
			return fail("not a JSON array", err)
		}
	case 0: // empty (or unreadable): as an empty JSONL file
		if _, err := dec.ReadToken(); err == io.EOF {
			return nil
		} else if err != nil {
			return fail("not JSON", err)
		}
	}
	for n := 1; ; n++ {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if array && dec.PeekKind() == ']' {
			if _, err := dec.ReadToken(); err != nil {
				return fail("the array", err)
			}
			break
		}
		if !array && n > 1 && dec.PeekKind() == 0 {
			if _, err := dec.ReadToken(); err == io.EOF {
				break
			}
		}
		v, err := dec.ReadValue()
		if err != nil {
			err = fail(fmt.Sprintf("element %d", n), err)
			if ferr := flush(); ferr != nil { // the elements before it
				return ferr
			}
			return err
		}
		start := line() - bytes.Count(v, []byte("\n"))
		it := replayItem{line: start, element: n, source: base + "#" + strconv.Itoa(n)}
		it.progress, offset = dec.InputOffset()-offset, dec.InputOffset()
		if len(v) > 4*limit { // even without its indentation; not worth keeping
			it.rej = &Rejection{File: base, Line: start, Element: it.element, Reason: schemas.ReasonTooLarge,
				Msg: fmt.Sprintf("%d bytes, over the limit of %d", len(v), limit)}
		} else {
			it.value, it.compact = bytes.Clone(v), true
			batchBytes += len(v)
		}
		batch = append(batch, it)
		if len(batch) == replayBatch || batchBytes >= 32<<20 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if array {
		if _, err := dec.ReadToken(); err != io.EOF {
			if err == nil {
				err = errors.New("more JSON after the array (one array per file)")
			}
			return fail("after the array", err)
		}
	}
	if src.size > 0 {
		r.advance(src.size - int64(bom) - offset)
	}
	return nil
}

// replayLineCounter counts the line feeds read through it.
type replayLineCounter struct {
	r     io.Reader
	lines int
}

func (c *replayLineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.lines += bytes.Count(p[:n], []byte("\n"))
	return n, err
}

// openText opens src for reading past its UTF-8 byte order mark, if any
// (counted as progress), and returns the mark's length; the caller closes
// the file.
func (r *replayRun) openText(src replaySource) (io.Closer, *bufio.Reader, int, error) {
	f, err := src.open()
	if err != nil {
		return nil, nil, 0, err
	}
	br := bufio.NewReaderSize(f, 1<<20)
	bom, err := replaySkipBOM(br)
	if err != nil {
		f.Close()
		return nil, nil, 0, fmt.Errorf("%s: %w", src.name, err)
	}
	r.advance(int64(bom))
	return f, br, bom, nil
}

// jsonl replays a file of rollout/v1 JSON objects, one per line.
func (r *replayRun) jsonl(src replaySource) error {
	path, base := src.name, src.base()
	f, br, _, err := r.openText(src)
	if err != nil {
		return err
	}
	defer f.Close()
	limit := r.maxBytes()
	decode := DecodeRollout(limit) // the ingest stage's checks
	batch := make([]replayItem, 0, replayBatch)
	var batchBytes int
	validate := func() error {
		err := r.validate(batch, base, decode)
		batch, batchBytes = batch[:0], 0
		return err
	}
	for n := 1; ; n++ {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		line, size, tooLong, err := replayReadLine(br, limit)
		if err != nil && err != io.EOF {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if size == 0 && err == io.EOF {
			return validate()
		}
		it := replayItem{progress: size, line: n, source: base + ":" + strconv.Itoa(n)}
		switch {
		case tooLong:
			it.rej = &Rejection{File: base, Line: n, Reason: schemas.ReasonTooLarge, Msg: fmt.Sprintf("line exceeds the limit of %d bytes", limit)}
		case len(bytes.TrimSpace(line)) == 0:
			// blank line: skipped
		default:
			it.value = bytes.Clone(line)
			batchBytes += len(line)
		}
		batch = append(batch, it)
		if len(batch) == replayBatch || batchBytes >= 32<<20 || err == io.EOF {
			if verr := validate(); verr != nil {
				return verr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// utf8BOM is the UTF-8 encoding of U+FEFF, which editors and Windows tools
// put at the start of a text file.
var utf8BOM = []byte("\xef\xbb\xbf")

// errNotUTF8 is the error of a file in UTF-16 or UTF-32: every record would
// be rejected as invalid_utf8, so the file is refused as a whole.
var errNotUTF8 = errors.New("the file starts with a UTF-16 or UTF-32 byte order mark; rollout files are read as UTF-8: convert it first (iconv -f UTF-16 -t UTF-8)")

// errCompressed is the error of a compressed file: its bytes would be
// rejected record by record as invalid_utf8.
var errCompressed = errors.New("the file is compressed (gzip or zstd); decompress it into trace replay's standard input, e.g. zcat FILE | trace replay -")

// replaySkipBOM discards a UTF-8 byte order mark at the start of br (RFC
// 8259 lets a parser ignore it; JSON exported on Windows often has one) and
// refuses a UTF-16 or UTF-32 one, and a compressed file.
// It returns the number of bytes discarded.
func replaySkipBOM(br *bufio.Reader) (int, error) {
	b, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}), bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return 0, errCompressed
	case bytes.HasPrefix(b, utf8BOM):
		return br.Discard(len(utf8BOM))
	case bytes.HasPrefix(b, []byte{0xff, 0xfe}), bytes.HasPrefix(b, []byte{0xfe, 0xff}), bytes.HasPrefix(b, []byte{0, 0, 0xfe}):
		return 0, errNotUTF8
	}
	return 0, nil
}

// replayReadLine reads one line without its line ending. A line longer than
// limit is consumed but not returned (tooLong), so one huge line cannot
// exhaust memory. size counts every byte consumed, line ending included.
func replayReadLine(br *bufio.Reader, limit int) (line []byte, size int64, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, e := br.ReadSlice('\n')
		size += int64(len(chunk))
		if !tooLong {
			if len(buf)+len(chunk) > limit+2 { // +2: the line ending
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if e == bufio.ErrBufferFull {
			continue
		}
		if e != nil && e != io.EOF {
			return nil, size, tooLong, e
		}
		buf = bytes.TrimSuffix(buf, []byte("\n"))
		buf = bytes.TrimSuffix(buf, []byte("\r"))
		if !tooLong && len(buf) > limit {
			tooLong, buf = true, nil
		}
		return buf, size, tooLong, e
	}
}

// tau2 converts and replays a τ²-bench result file, one rollout per
// simulation. The file is read twice with a streaming decoder (scanTau2,
// then tau2Walk), one batch of simulations at a time, so its size does not
// matter: a pipe is copied to a temporary file first. Nothing is published
// when the first pass finds the file malformed as a whole.
func (r *replayRun) tau2(src replaySource) error {
	path := src.name
	if !src.regular {
		spooled, err := src.spool()
		if err != nil {
			return err
		}
		defer os.Remove(spooled.path)
		src = spooled
	}
	fh, err := src.open()
	if err != nil {
		return err
	}
	meta, err := scanTau2(r.ctx, fh)
	fh.Close()
	if err != nil {
		if cerr := r.ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	if fh, err = src.open(); err != nil {
		return err
	}
	defer fh.Close()
	base, source := src.base(), path
	if path == "-" {
		source = base
	}
	c := newTau2Converter(meta, Tau2Options{Source: source})
	decode := DecodeRollout(r.maxBytes()) // the ingest stage's checks
	var done int64                        // input bytes accounted for
	var stop error                        // the context's or Kafka's: not the file's
	n, err := tau2Walk(fh, nil, func(first int, raw []jsontext.Value, ends []int64) error {
		if stop = r.ctx.Err(); stop != nil {
			return stop
		}
		items := make([]replayItem, len(raw))
		for k := range items {
			items[k].progress, done = ends[k]-done, ends[k]
		}
		replayParallel(len(raw), func(k int) {
			i := first + k
			it := &items[k]
			it.source = base + "#" + strconv.Itoa(i+1)
			s, err := decodeTau2Simulation(i, raw[k])
			raw[k] = nil // the batch's text is not kept past its conversion
			if err != nil {
				it.rej = &Rejection{File: base, Line: i + 1, Simulation: true, Reason: ReasonTau2Invalid, Msg: err.Error()}
				return
			}
			ro := c.rollout(s)
			b, err := json.Marshal(ro)
			if err != nil {
				it.rej = &Rejection{File: base, Line: i + 1, Simulation: true, RolloutID: ro.RolloutID, Reason: schemas.ReasonSchema, Msg: err.Error()}
				return
			}
			valid, err := decode(b)
			if err != nil {
				reason, msg := replayReason(err)
				it.rej = &Rejection{File: base, Line: i + 1, Simulation: true, RolloutID: ro.RolloutID, Reason: reason, Msg: msg}
				return
			}
			it.key, it.value = []byte(valid.Key()), b
		})
		stop = r.emit(items)
		return stop
	})
	if stop != nil {
		return stop
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if n != meta.n {
		return fmt.Errorf("%s: the file changed while it was read (%d simulations, then %d)", path, meta.n, n)
	}
	if src.size > done {
		r.advance(src.size - done)
	}
	return nil
}

func replayIsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

func replayHumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
