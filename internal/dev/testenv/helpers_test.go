package testenv_test

import (
	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

func openConn(o *clickhouse.Options) (driver.Conn, error) { return clickhouse.Open(o) }
