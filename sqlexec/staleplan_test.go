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
