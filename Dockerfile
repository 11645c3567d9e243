# Multi-stage build of the trace binary.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/trace ./cmd/trace

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 trace \
    && install -d -o trace -g trace /var/lib/trace
COPY --from=build /out/trace /usr/local/bin/trace
USER trace
# The working directory is the user's: `trace run`'s ./data and the
# adapters' default file:///var/lib/trace/adapters are written there.
WORKDIR /var/lib/trace
EXPOSE 8080
ENTRYPOINT ["trace"]
CMD ["run"]
