package sqlexec_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlexec"
)

// TestStalePlan: a plan outdated by DDL is recognised by the server function that
// raises it, in any server language, as well as by its English message; the driver and
// the proxy ask the same function.
func TestStalePlan(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "26000", Message: `prepared statement "x" does not exist`}, true},
		{&pgconn.PgError{Code: "0A000", Message: "cached plan must not change result type"}, true},
		{&pgconn.PgError{Code: "0A000", Message: "el plan almacenado no debe cambiar el tipo de resultado", Routine: "RevalidateCachedQuery"}, true},
		{fmt.Errorf("shard 1: %w", &pgconn.PgError{Code: "0A000", Routine: "RevalidateCachedQuery"}), true},
		{&pgconn.PgError{Code: "0A000", Message: "shardlab: window functions across shards"}, false},
		{&pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, false},
		{fmt.Errorf("network"), false},
	} {
		if got := sqlexec.StalePlan(tc.err); got != tc.want {
			t.Errorf("StalePlan(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestReusable: a connection goes back to its pool after the server's answer to a
// statement, never after a cancelled statement, a server that ended the session, or a
// network error; the driver, the proxy and the engine decide by this one function.
func TestReusable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "23505"}, true},
		{fmt.Errorf("shard 0: %w", &pgconn.PgError{Severity: "ERROR", Code: "40P01"}), true},
		{&pgconn.PgError{Severity: "ERROR", Code: "57014"}, false},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01"}, false},
		{fmt.Errorf("read tcp: connection reset by peer"), false},
	} {
		if got := sqlexec.Reusable(tc.err); got != tc.want {
			t.Errorf("Reusable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
