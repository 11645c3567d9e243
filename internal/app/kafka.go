package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/traceops/trace/internal/config"
)

// KafkaDialer builds the dialer for TLS and SASL, or nil when neither is set.
func KafkaDialer(k config.Kafka) (*kafka.Dialer, error) {
	if !k.TLS.Enabled && k.SASL.Mechanism == "" {
		return nil, nil
	}
	d := &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true}
	if k.TLS.Enabled {
		tc, err := TLSConfig(k.TLS)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls: %w", err)
		}
		d.TLS = tc
	}
	var mech sasl.Mechanism
	var err error
	switch k.SASL.Mechanism {
	case "plain":
		mech = plain.Mechanism{Username: k.SASL.Username, Password: k.SASL.Password}
	case "scram-sha-256":
		mech, err = scram.Mechanism(scram.SHA256, k.SASL.Username, k.SASL.Password)
	case "scram-sha-512":
		mech, err = scram.Mechanism(scram.SHA512, k.SASL.Username, k.SASL.Password)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka.sasl: %w", err)
	}
	d.SASLMechanism = mech
	return d, nil
}

// TLSConfig loads a client TLS configuration.
func TLSConfig(t config.TLS) (*tls.Config, error) {
	tc := &tls.Config{InsecureSkipVerify: t.SkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// Transport is a kafka-go transport for writers with the configured TLS and
// SASL settings.
func (a *App) Transport() *kafka.Transport { return KafkaTransport(a.Dialer) }

// KafkaTransport is a kafka-go transport for writers with the TLS and SASL
// settings of d (KafkaDialer's; nil: neither), for the producers of the
// client commands (trace replay, trace simulate) as of the roles.
func KafkaTransport(d *kafka.Dialer) *kafka.Transport {
	t := &kafka.Transport{}
	if d != nil {
		t.TLS, t.SASL = d.TLS, d.SASLMechanism
	}
	return t
}
