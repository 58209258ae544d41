package sqldiff

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// SQLRunner runs the suite through database/sql, for a database/sql driver: the
// unsharded reference through pgx's driver, the sharded side through shardlab's.
// database/sql hands out Go values, not the wire's bytes, so an Answer holds each value
// printed with its Go type ("int64 42"), the columns' database type names in place of
// OIDs, and for statements without rows the affected-row count as the tag.
type SQLRunner struct {
	DB *sql.DB
	// NoTypeNames leaves the database type names out of the columns (SQLite's driver
	// reports the declared types, which a merge of shards cannot know).
	NoTypeNames bool
}

// Extended implements Runner; binary is meaningless through database/sql.
func (r SQLRunner) Extended(ctx context.Context, query string, params []*string, _ bool) (*Answer, error) {
	args := make([]any, len(params))
	for i, p := range params {
		if p != nil {
			args[i] = *p
		}
	}
	return r.run(ctx, query, args)
}

// Simple implements Runner: a statement without arguments.
func (r SQLRunner) Simple(ctx context.Context, query string) (*Answer, error) {
	return r.run(ctx, query, nil)
}

func returnsRows(query string) bool {
	q := strings.ToUpper(strings.TrimSpace(query))
	return strings.HasPrefix(q, "SELECT") || strings.HasPrefix(q, "WITH") || strings.HasPrefix(q, "VALUES") ||
		strings.HasPrefix(q, "TABLE") || strings.Contains(q, "RETURNING")
}

func (r SQLRunner) run(ctx context.Context, query string, args []any) (*Answer, error) {
	if !returnsRows(query) {
		res, err := r.DB.ExecContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, err
		}
		return &Answer{Tag: fmt.Sprint(n)}, nil
	}
	rows, err := r.DB.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	a := &Answer{}
	cols, err := rows.ColumnTypes()
	if err != nil {
		return nil, err
	}
	for _, c := range cols {
		name := c.Name()
		if !r.NoTypeNames {
			name += " " + c.DatabaseTypeName()
		}
		a.Columns = append(a.Columns, name)
	}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([][]byte, len(vals))
		for i, v := range vals {
			if v == nil {
				continue
			}
			if t, ok := v.(time.Time); ok {
				v = t.UTC().Format(time.RFC3339Nano)
			}
			row[i] = fmt.Appendf(nil, "%T %v", v, v)
		}
		a.Rows = append(a.Rows, row)
	}
	return a, rows.Err()
}
