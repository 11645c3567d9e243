// Package bus is trace's NATS JetStream layer: the streams, consumers and
// KV buckets trace uses — synthesis requests and dictionaries (this file),
// the environments' ready announcements (environments.go), training jobs
// and their events (training.go), adapter activations and transitions
// (adapters.go) — and exactly-once publication of synthesis requests.
//
// Exactly once across analyzer replicas rests on two mechanisms:
//   - the request's Msg-Id is the deterministic trigger id, so JetStream
//     drops a second publish within the stream's duplicate window;
//   - after a successful publish the trigger id is claimed in the KV bucket
//     trace_trigger_claims with Create, so a replica that evaluates the same
//     trigger later than the duplicate window sees the claim and does not
//     publish again.
//
// Publishing first and claiming second means a crash between the two causes a
// re-publish that the duplicate window absorbs, never a lost request.
package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/traceops/trace/schemas"
)

// Names of the JetStream resources trace owns.
const (
	StreamSynthesis   = "TRACE_SYNTHESIS"
	SubjectSynthesis  = "trace.synthesis" // trace.synthesis.<env>.<capability>
	StreamEnvReady    = "TRACE_ENVIRONMENTS"
	SubjectEnvReady   = "trace.environments.ready"
	BucketClaims      = "trace_trigger_claims"
	BucketDictionary  = "trace_dictionaries"
	DefaultDuplicates = 10 * time.Minute
	// MinDuplicates is JetStream's smallest duplicate window.
	MinDuplicates = 100 * time.Millisecond
)

// Config locates NATS.
type Config struct {
	URL        string        `koanf:"url"`        // nats://host:4222; empty = embedded server
	CredsFile  string        `koanf:"creds_file"` // NATS credentials file (secret path)
	Token      string        `koanf:"token"`      // secret
	TLSCA      string        `koanf:"tls_ca"`     // CA file for TLS
	TLSCert    string        `koanf:"tls_cert"`   // client certificate
	TLSKey     string        `koanf:"tls_key"`    // client key
	Duplicates time.Duration `koanf:"duplicates"` // JetStream duplicate window, default (0) 10m; at least MinDuplicates
	StoreDir   string        `koanf:"store_dir"`  // embedded server's JetStream dir
	// StreamMaxAge is the max age of TRACE_SYNTHESIS and TRACE_ENVIRONMENTS
	// (limits-based streams, which otherwise keep every message): set
	// when trace creates them and, when positive, on existing streams at
	// connect (see ensureMaxAge). 0 (default): created without a limit,
	// and an existing stream's limit is left as it is.
	StreamMaxAge time.Duration `koanf:"stream_max_age"`
}

// Validate checks the settings trace applies to JetStream, naming them by
// their configuration keys.
func (c Config) Validate() error {
	// A negative window used to become the default silently; JetStream
	// refuses a positive one under 100 ms when it creates a stream.
	if c.Duplicates < 0 || (c.Duplicates > 0 && c.Duplicates < MinDuplicates) {
		return fmt.Errorf("nats.duplicates: must be 0 (the default, %s) or at least %s, got %s", DefaultDuplicates, MinDuplicates, c.Duplicates)
	}
	if c.StreamMaxAge < 0 {
		return fmt.Errorf("nats.stream_max_age: must be 0 (keep every message) or positive, got %s", c.StreamMaxAge)
	}
	// JetStream refuses a stream whose duplicate window is longer than its
	// max age.
	if dup := c.DuplicateWindow(); c.StreamMaxAge > 0 && c.StreamMaxAge < dup {
		return fmt.Errorf("nats.stream_max_age: %s is shorter than the de-duplication window nats.duplicates (%s)", c.StreamMaxAge, dup)
	}
	return nil
}

// DuplicateWindow is the duplicate window in effect.
func (c Config) DuplicateWindow() time.Duration {
	if c.Duplicates <= 0 {
		return DefaultDuplicates
	}
	return c.Duplicates
}

// Bus is a connection with trace's streams and buckets ensured.
type Bus struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	claims jetstream.KeyValue
	dicts  jetstream.KeyValue

	trainingClaims jetstream.KeyValue
}

// ErrNotConnected is the error of a Connect whose first connection to NATS
// was not made before its context ended (the server is unreachable, or
// refuses the credentials).
var ErrNotConnected = errors.New("not connected")

// connectWait bounds Connect's wait for the first connection when ctx has
// no deadline.
const connectWait = 5 * time.Second

// Connect dials NATS (reconnecting forever once connected), waits for the
// first connection until ctx ends (connectWait without a deadline), and
// ensures streams and buckets. An error while not connected wraps
// ErrNotConnected and names the URL and the last connection error. It logs
// to slog.Default (see ConnectLogged).
func Connect(ctx context.Context, cfg Config, name string) (*Bus, error) {
	return ConnectLogged(ctx, cfg, name, slog.Default())
}

// ConnectLogged is Connect logging to log: a lost connection (warning, with
// the server and the error), the reconnection (with how long it was down),
// and the client's asynchronous errors (a watch's consumer recreated,
// a slow consumer), which the NATS client printed to standard error
// otherwise. Closing the bus logs nothing.
func ConnectLogged(ctx context.Context, cfg Config, name string, log *slog.Logger) (*Bus, error) {
	var lastErr atomic.Pointer[error] // the last failed connection attempt
	var downSince atomic.Int64        // unix nanos of the last disconnection
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				lastErr.Store(&err)
			}
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() || nc.IsDraining() {
				return
			}
			downSince.Store(time.Now().UnixNano())
			log.Warn("nats: disconnected; reconnecting", "url", RedactURLs(cfg.URL), "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			args := []any{"url", nc.ConnectedUrlRedacted()}
			if t := downSince.Load(); t != 0 {
				args = append(args, "down_for", time.Since(time.Unix(0, t)).Round(time.Millisecond))
			}
			log.Info("nats: reconnected", args...)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			args := []any{"err", err}
			if sub != nil {
				args = append(args, "subject", sub.Subject)
			}
			log.Warn("nats: asynchronous error", args...)
		})}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", RedactURLs(cfg.URL), err)
	}
	if err := waitConnected(ctx, nc, &lastErr); err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats %s: %w", RedactURLs(cfg.URL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &Bus{NC: nc, JS: js}
	if err := b.ensure(ctx, cfg, log); err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// waitConnected returns once nc is connected, or an error wrapping
// ErrNotConnected with the last connection error when ctx (or connectWait,
// without a deadline) ends first. With RetryOnFailedConnect the client
// dials in the background: without this wait the first JetStream request
// timed out instead, with an error that named neither the server nor why.
func waitConnected(ctx context.Context, nc *nats.Conn, lastErr *atomic.Pointer[error]) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, connectWait)
		defer cancel()
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			why := nc.Status().String()
			if err := lastErr.Load(); err != nil {
				why = (*err).Error()
			}
			return fmt.Errorf("%w (%s): %w", ErrNotConnected, why, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

func (b *Bus) ensure(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	dup := cfg.DuplicateWindow()
	for _, sc := range append([]jetstream.StreamConfig{
		{Name: StreamSynthesis, Subjects: []string{SubjectSynthesis + ".>"}, Storage: jetstream.FileStorage, Duplicates: dup, MaxAge: cfg.StreamMaxAge},
		{Name: StreamEnvReady, Subjects: []string{SubjectEnvReady + ".>", SubjectEnvReady}, Storage: jetstream.FileStorage, Duplicates: dup, MaxAge: cfg.StreamMaxAge},
	}, append(trainingStreams(dup), adapterStreams(dup)...)...) {
		// Existing streams are left as operators configured them (replicas,
		// limits); only missing ones are created. The exception is the
		// max age of the two streams nats.stream_max_age is for, when set.
		if s, err := b.JS.Stream(ctx, sc.Name); err == nil {
			if sc.Name == StreamSynthesis || sc.Name == StreamEnvReady {
				if err := b.ensureMaxAge(ctx, s, cfg.StreamMaxAge, log); err != nil {
					return err
				}
			}
			continue
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("nats: stream %s: %w", sc.Name, err)
		}
		if _, err := b.JS.CreateStream(ctx, sc); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("nats: stream %s: %w", sc.Name, err)
		}
	}
	var err error
	if b.claims, err = keyValue(ctx, b.JS, jetstream.KeyValueConfig{Bucket: BucketClaims, Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	if b.dicts, err = keyValue(ctx, b.JS, jetstream.KeyValueConfig{Bucket: BucketDictionary, Storage: jetstream.FileStorage, History: 5}); err != nil {
		return err
	}
	if b.trainingClaims, err = keyValue(ctx, b.JS, jetstream.KeyValueConfig{Bucket: BucketTrainingClaims, Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	return nil
}

// ensureMaxAge gives the existing stream s the max age want, when want is
// set (positive) and the stream has another, logging the change at INFO
// with the old and new values; a shorter max age deletes the messages
// older than it at once. With want 0 the stream's limit is left alone: it
// may be one an operator set (`nats stream edit --max-age`, as these docs
// said before the setting existed), and an unset setting must not remove
// it.
//
// Replicas starting together may each update the stream: the updates are
// the same. Replicas configured differently would undo each other's at
// every start; give them one value.
func (b *Bus) ensureMaxAge(ctx context.Context, s jetstream.Stream, want time.Duration, log *slog.Logger) error {
	info := s.CachedInfo()
	if want <= 0 || info == nil || info.Config.MaxAge == want {
		return nil
	}
	sc := info.Config
	have := sc.MaxAge
	sc.MaxAge = want
	if _, err := b.JS.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("nats: stream %s: setting its max age from %s to %s (nats.stream_max_age): %w", sc.Name, maxAgeText(have), want, err)
	}
	msg := "nats: raised the stream's max age (nats.stream_max_age)"
	if have == 0 || want < have {
		msg = "nats: shortened the stream's max age (nats.stream_max_age); its messages older than that are deleted"
	}
	log.Info(msg, "stream", sc.Name, "old", maxAgeText(have), "new", want.String())
	return nil
}

// maxAgeText is a stream's max age as logged: 0 is no limit.
func maxAgeText(d time.Duration) string {
	if d <= 0 {
		return "none (keep every message)"
	}
	return d.String()
}

// keyValue opens a bucket, creating it when missing.
func keyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("nats: kv %s: %w", cfg.Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("nats: kv %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Close drains and closes the connection.
func (b *Bus) Close() {
	if b != nil && b.NC != nil {
		_ = b.NC.Drain()
	}
}

var tokenRe = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// Token makes s a valid single NATS subject token / KV key part.
func Token(s string) string { return tokenRe.ReplaceAllString(s, "_") }

// SynthesisSubject is trace.synthesis.<env>.<capability>.
func SynthesisSubject(env, capability string) string {
	return SubjectSynthesis + "." + Token(env) + "." + Token(capability)
}

// PublishResult says what PublishSynthesis did.
type PublishResult struct {
	Published bool // a new message is in the stream
	Duplicate bool // JetStream had it already (same Msg-Id within the window)
	Claimed   bool // the KV claim showed another publisher did it earlier
	// Stored is the request as the stream holds it, when it was there
	// already (Duplicate, Claimed): another replica's, or this one's
	// earlier attempt, computed then and so not always equal to req. Nil
	// when it could not be read (the stream's limits removed it).
	Stored *schemas.SynthesisRequest
}

// PublishSynthesis publishes a synthesis request exactly once per trigger id.
// A returned error means the request may not be delivered: the caller keeps
// the trigger pending and retries.
func (b *Bus) PublishSynthesis(ctx context.Context, req *schemas.SynthesisRequest) (PublishResult, error) {
	key := "t_" + Token(req.TriggerID)
	if e, err := b.claims.Get(ctx, key); err == nil {
		var claim struct {
			Seq uint64 `json:"stream_seq"`
		}
		res := PublishResult{Claimed: true}
		if json.Unmarshal(e.Value(), &claim) == nil && claim.Seq > 0 {
			res.Stored = b.storedSynthesis(ctx, claim.Seq)
		}
		return res, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return PublishResult{}, fmt.Errorf("nats: read claim: %w", err)
	}
	req.Schema = "synthesis_request/v1"
	data, err := json.Marshal(req)
	if err != nil {
		return PublishResult{}, err
	}
	ack, err := b.JS.Publish(ctx, SynthesisSubject(req.Environment, req.Capability.Skill), data, jetstream.WithMsgID(req.TriggerID))
	if err != nil {
		return PublishResult{}, fmt.Errorf("nats: publish synthesis request: %w", err)
	}
	if _, err := b.claims.Create(ctx, key, []byte(fmt.Sprintf(`{"stream_seq":%d}`, ack.Sequence))); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return PublishResult{}, fmt.Errorf("nats: claim: %w", err)
	}
	res := PublishResult{Published: !ack.Duplicate, Duplicate: ack.Duplicate}
	if ack.Duplicate { // the ack names the message stored first
		res.Stored = b.storedSynthesis(ctx, ack.Sequence)
	}
	return res, nil
}

// storedSynthesis is the synthesis request at sequence seq of its stream,
// nil when it cannot be read or decoded.
func (b *Bus) storedSynthesis(ctx context.Context, seq uint64) *schemas.SynthesisRequest {
	st, err := b.JS.Stream(ctx, StreamSynthesis)
	if err != nil {
		return nil
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return nil
	}
	var req schemas.SynthesisRequest
	if json.Unmarshal(m.Data, &req) != nil || req.TriggerID == "" {
		return nil
	}
	return &req
}

// AnnounceDictionary tells every analyzer that (env, agentVersion) has a new
// dictionary version stored in ClickHouse.
func (b *Bus) AnnounceDictionary(ctx context.Context, env, agentVersion string, version uint32) error {
	_, err := b.dicts.Put(ctx, DictionaryKey(env, agentVersion), []byte(fmt.Sprint(version)))
	if err != nil {
		return fmt.Errorf("nats: announce dictionary: %w", err)
	}
	return nil
}

// DictionaryKey is the KV key of a dictionary scope.
func DictionaryKey(env, agentVersion string) string {
	if agentVersion == "*" {
		agentVersion = "ALL"
	}
	return Token(env) + "." + Token(agentVersion)
}

// WatchDictionaries calls fn for every dictionary announcement (including the
// current values at start) until ctx ends. The watch survives NATS restarts
// on the same storage; when it ends otherwise (NATS came back without its
// JetStream storage: the bucket is gone) it returns an error, so that the
// process stops and is restarted, which creates the bucket again. It
// returned nil, which ended its role's actor and so the whole process,
// with exit status 0 and nothing in the log.
func (b *Bus) WatchDictionaries(ctx context.Context, fn func(key string)) error {
	w, err := b.dicts.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("nats: watch dictionaries: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				why := "the watch ended"
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if _, err := b.JS.KeyValue(sctx, BucketDictionary); errors.Is(err, jetstream.ErrBucketNotFound) {
					why = "the bucket is gone (NATS restarted without its JetStream storage?); a restart of trace creates it again"
				} else if err != nil {
					why += " (" + err.Error() + ")"
				}
				cancel()
				return fmt.Errorf("nats: watch of KV bucket %s: %s", BucketDictionary, why)
			}
			if e != nil {
				fn(e.Key())
			}
		}
	}
}

// RedactURLs masks the password of each URL in a comma-separated list (a
// NATS server list; any other URL too), as url.URL.Redacted does; what
// does not parse as a URL with a password is kept.
func RedactURLs(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				parts[i] = u.Redacted()
			}
		}
	}
	return strings.Join(parts, ",")
}
