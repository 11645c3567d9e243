// Package embedded starts the servers trace needs when none is configured:
// a Kafka-protocol broker (kfake), a NATS server with JetStream, and a local
// ClickHouse server. They are for a laptop and the demo; each logs one line
// saying what it started, where, and that production should use real
// clusters.
package embedded

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/traceops/trace/internal/chserver"
)

// Kafka starts kfake listening on addr (host:port, host must be a loopback
// address) with its log and group offsets under dir, so they survive a
// restart. Topics are created on first use with partitions partitions.
// Every topic accepts record batches of up to maxMessageBytes (the broker's
// message.max.bytes; kfake's default is Kafka's, about 1 MiB).
func Kafka(addr, dir string, partitions, maxMessageBytes int, log *slog.Logger, seed ...string) (*kfake.Cluster, error) {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: port %q: %w", portS, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir),
		kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(partitions),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(maxMessageBytes)}),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
	}
	if len(seed) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(partitions), seed...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka on %s: %w (is another broker listening there? set kafka.brokers or kafka.embedded_addr)", addr, err)
	}
	log.Info("embedded: started a Kafka-protocol broker (kfake); production should use a real Kafka cluster (kafka.brokers)",
		"addr", c.ListenAddrs()[0], "data", dir, "max_message_bytes", maxMessageBytes)
	return c, nil
}

// NATS starts an embedded nats-server with JetStream on 127.0.0.1 (port 0 =
// any free port) storing under dir.
func NATS(dir string, port int, log *slog.Logger) (*server.Server, string, error) {
	port = cmp.Or(port, server.RANDOM_PORT)
	if port != server.RANDOM_PORT {
		// nats-server reports a port in use only in its log (off here),
		// and then never gets ready: try the port first, to say so.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, "", fmt.Errorf("embedded nats on 127.0.0.1:%d: %w (is another NATS server, or another trace run, listening there? set nats.url or embedded.nats_port)", port, err)
		}
		l.Close()
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "trace-embedded", Host: "127.0.0.1", Port: port,
		JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, "", fmt.Errorf("embedded nats: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, "", fmt.Errorf("embedded nats: not ready after 10s")
	}
	url := ns.ClientURL()
	log.Info("embedded: started nats-server with JetStream; production should use a NATS cluster (nats.url)", "url", url, "data", dir)
	return ns, url, nil
}

// ClickHouse starts a local ClickHouse server from PATH (clickhouse-server,
// or the official single binary as `clickhouse server`) with a generated
// config under dir. The error says how to install it when it is missing.
func ClickHouse(ctx context.Context, dir string, tcpPort, httpPort int, log *slog.Logger) (*chserver.Server, error) {
	s, err := chserver.Start(ctx, chserver.Options{Dir: dir, TCPPort: tcpPort, HTTPPort: httpPort, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("embedded clickhouse: %w", err)
	}
	log.Info("embedded: started a local ClickHouse server; production should use a ClickHouse cluster (clickhouse.addr)",
		"addr", s.Addr(), "version", s.Version(), "data", dir)
	return s, nil
}
