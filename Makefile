# The README's test command is `make test`; .ci/run runs it in CI.
GO ?= go

.PHONY: test test-short build

# Everything: vet, then every test against real servers (kfake, embedded
# NATS, and a local ClickHouse that internal/dev/testenv starts, or the one in
# TRACE_TEST_CLICKHOUSE).
test: setup-test
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...

# The fast local run: tests that start servers or run long skip themselves
# under -short.
test-short:
	$(GO) test -short -count=1 -timeout 10m ./...

build:
	mkdir -p bin
	$(GO) build -o bin/trace ./cmd/trace

# The README's first command: install what the demo needs (a ClickHouse
# server binary, from the distribution on Debian/Ubuntu), build, and run the
# whole loop on embedded servers.
.PHONY: setup demo
setup:
	@command -v clickhouse-server >/dev/null 2>&1 || command -v clickhouse >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "installing clickhouse-server (Debian/Ubuntu package)"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clickhouse-server clickhouse-client; \
	  else \
	    echo "trace needs a ClickHouse server binary on PATH: install clickhouse-server, or ClickHouse's single binary 'clickhouse'"; exit 1; \
	  fi; }

demo: setup build
	./bin/trace demo

# Tests also drive the dashboard in headless Chromium.
.PHONY: setup-test
setup-test: setup
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; \
	  else echo "dashboard browser tests need chromium on PATH; they skip without it"; fi; }
