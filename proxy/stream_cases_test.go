package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStreamTextOrderPoolOfOne: with a pool of one connection per data source, a
// cross-shard ORDER BY on text (byte order, and a collation whose ranks the server
// gives) never needs a second connection of a data source while the stream holds the
// first.
func TestStreamTextOrderPoolOfOne(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil, withPool(1, 3*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := e.connect(t)
	if _, err := c.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		if _, err := c.Exec(ctx, "INSERT INTO items VALUES ($1, $2)", i, fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		"SELECT id, v FROM items ORDER BY v, id",
		`SELECT id, v FROM items ORDER BY v COLLATE "en-US-x-icu", id`,
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			rows, err := c.Query(ctx, q, mode)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil {
				t.Errorf("%s (%v): %v", q, mode, err)
			} else if n != 10 {
				t.Errorf("%s: %d rows", q, n)
			}
		}
	}
}
