package sqlexec

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// ErrKeyDefaultChanged is returned by DrawKeys when the key column's default no longer
// draws from the sequence the statement was planned with, or the column's identity
// changed (DDL beside the sharding layer): nothing was drawn, and the statement must be
// planned again from fresh catalog answers.
var ErrKeyDefaultChanged = errors.New("sqlexec: the sharding key's default changed since the statement was planned")

// DrawKeys draws the keys an INSERT leaves to its sharding key's sequence
// (sqlplan.Plan.Keys), in one round trip on the caller's connection to the data source
// holding the sequence (inside the caller's transaction when one is open: nextval is
// never rolled back, as on one database). The same round trip checks, by OID, that
// the key's default still draws from that sequence and that the identities the plan
// took into account are unchanged. The keys go in sqlplan.Args.Keys before Bind.
func DrawKeys(ctx context.Context, conns Conns, k *sqlplan.KeySource) ([]string, error) {
	keys := make([]string, 0, k.Count)
	err := conns.Run(ctx, k.DataSource, func(conn *pgconn.PgConn) error {
		// Prepared once per connection: planning the check would cost more than
		// running it.
		desc, err := prepared(ctx, conn, drawQuery, nil)
		if err != nil {
			return err
		}
		rr := conn.ExecPrepared(ctx, desc.Name, [][]byte{
			[]byte(k.TableOID), []byte(k.Column), []byte(k.SequenceOID), []byte(strconv.Itoa(k.Count)),
			[]byte(strconv.FormatBool(k.Always)), []byte(strconv.FormatBool(k.OtherAlways)), []byte(k.DefaultTree),
		}, nil, nil)
		for rr.NextRow() {
			keys = append(keys, string(rr.Values()[0]))
		}
		_, err = rr.Close()
		return err
	})
	conns.Release(k.DataSource, err)
	if err == nil && len(keys) == 0 && k.Count > 0 {
		return nil, ErrKeyDefaultChanged
	}
	return keys, err
}

// drawQuery draws $4 values from the sequence of OID $3 while column $2 of the table of
// OID $1 is as planned: GENERATED ALWAYS or not ($5), another GENERATED ALWAYS column
// or not ($6), and the same stored default expression ($7, "" for none: an identity),
// which names the sequence by OID. Index lookups only: it runs before every keyless
// INSERT. (An identity's own sequence never changes while the column stays one.)
const drawQuery = `SELECT pg_catalog.nextval($3::text::pg_catalog.oid::pg_catalog.regclass) FROM pg_catalog.generate_series(1, $4::int)
 WHERE (SELECT (a.attidentity = 'a', coalesce(d.adbin::text, ''))
          FROM pg_catalog.pg_attribute a
          LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = $1::text::pg_catalog.oid AND a.attname = $2 AND NOT a.attisdropped) = ($5::bool, $7::text COLLATE "C")
   AND EXISTS (SELECT FROM pg_catalog.pg_attribute o WHERE o.attrelid = $1::text::pg_catalog.oid AND o.attnum > 0
                  AND NOT o.attisdropped AND o.attidentity = 'a' AND o.attname <> $2) = $6::bool`
