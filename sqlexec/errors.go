package sqlexec

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// unsupported refuses what a merge cannot answer exactly (see sqlplan.Unsupported).
var unsupported = sqlplan.Unsupported

func pgErr(code, format string, args ...any) *pgconn.PgError {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: fmt.Sprintf(format, args...)}
}

// ShardError is an error from one data source, naming it. It wraps what the data source
// said, so errors.As finds a *pgconn.PgError with the server's SQLSTATE.
type ShardError struct {
	DataSource int    // index in the rules
	Name       string // the data source's name in the rules
	Err        error
}

func (e *ShardError) Error() string { return fmt.Sprintf("data source %s: %v", e.Name, e.Err) }

// Unwrap returns the data source's error.
func (e *ShardError) Unwrap() error { return e.Err }

// SQLState returns the SQLSTATE a client should see: the server's when it sent one,
// 08006 (connection failure) when the data source could not be reached or dropped the
// connection.
func (e *ShardError) SQLState() string {
	var pe *pgconn.PgError
	if errors.As(e.Err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03": // the server is shutting down or starting: it is down
			return "08006"
		}
		return pe.Code
	}
	return "08006"
}
