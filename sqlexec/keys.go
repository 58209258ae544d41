package sqlexec

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// DrawKeys draws the keys an INSERT leaves to its sharding key's sequence
// (sqlplan.Plan.Keys), in one round trip on the caller's connection to the data source
// holding the sequence (inside the caller's transaction when one is open: nextval is
// never rolled back, as on one database). They go in sqlplan.Args.Keys before Bind.
func DrawKeys(ctx context.Context, conns Conns, k *sqlplan.KeySource) ([]string, error) {
	keys := make([]string, 0, k.Count)
	err := conns.Run(ctx, k.DataSource, func(conn *pgconn.PgConn) error {
		rr := conn.ExecParams(ctx, k.SQL(), nil, nil, nil, nil)
		for rr.NextRow() {
			keys = append(keys, string(rr.Values()[0]))
		}
		_, err := rr.Close()
		return err
	})
	conns.Release(k.DataSource, err)
	return keys, err
}
