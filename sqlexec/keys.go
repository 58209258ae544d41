package sqlexec

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// ErrKeyDefaultChanged is returned by DrawKeys when the key column's default no longer
// draws from the sequence the statement was planned with (DDL beside the sharding
// layer): nothing was drawn, and the statement should be planned again.
var ErrKeyDefaultChanged = errors.New("sqlexec: the sharding key's default changed since the statement was planned")

// DrawKeys draws the keys an INSERT leaves to its sharding key's sequence
// (sqlplan.Plan.Keys), in one round trip on the caller's connection to the data source
// holding the sequence (inside the caller's transaction when one is open: nextval is
// never rolled back, as on one database). The same round trip checks that the key's
// default still draws from that sequence. The keys go in sqlplan.Args.Keys before Bind.
func DrawKeys(ctx context.Context, conns Conns, k *sqlplan.KeySource) ([]string, error) {
	keys := make([]string, 0, k.Count)
	err := conns.Run(ctx, k.DataSource, func(conn *pgconn.PgConn) error {
		rr := conn.ExecParams(ctx, drawQuery, [][]byte{
			[]byte(nodeName(k.Rule.Nodes[0])), []byte(k.Column), []byte(k.Sequence), []byte(strconv.Itoa(k.Count)),
		}, nil, nil, nil)
		for rr.NextRow() {
			keys = append(keys, string(rr.Values()[0]))
		}
		_, err := rr.Close()
		return err
	})
	conns.Release(k.DataSource, err)
	if err == nil && len(keys) == 0 && k.Count > 0 {
		return nil, ErrKeyDefaultChanged
	}
	return keys, err
}

// drawQuery draws $4 values from sequence $3 when it is still what the default of
// column $2 of table $1 draws from, and none otherwise.
const drawQuery = `SELECT pg_catalog.nextval($3::text::pg_catalog.regclass) FROM pg_catalog.generate_series(1, $4::int)
 WHERE (SELECT k.seq FROM (` + keySequenceQuery + `) k) = $3::text`
