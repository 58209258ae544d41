package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestChainAsOnOneServer runs COMMIT AND CHAIN and ROLLBACK AND CHAIN scripts on one
// PostgreSQL database and through the proxy over two shards (in both pool modes), and
// compares what the client sees after each query string: the command tags or the
// error, the notices, the transaction status, and the characteristics of the transaction then open
// (isolation level, read only, deferrable). The table's rows, spread over both shards,
// are compared at the end. PostgreSQL is the judge.
func TestChainAsOnOneServer(t *testing.T) {
	scripts := map[string][]string{
		"commit and chain keeps the options": {
			"SET default_transaction_read_only = on",
			"START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ WRITE, DEFERRABLE",
			"INSERT INTO chain_t VALUES (1), (2), (3)",
			"COMMIT AND CHAIN",
			"INSERT INTO chain_t VALUES (4)",
			"COMMIT",
			"RESET default_transaction_read_only",
		},
		"a failed transaction chains": {
			"BEGIN ISOLATION LEVEL SERIALIZABLE",
			"INSERT INTO chain_t VALUES (5), (6)",
			"SELECT 1/0",
			"COMMIT AND CHAIN",
			"INSERT INTO chain_t VALUES (7)",
			"ROLLBACK AND CHAIN",
			"INSERT INTO chain_t VALUES (8), (9)",
			"COMMIT",
		},
		"set transaction before the failure": {
			"BEGIN; SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
			"SELECT 1/0",
			"COMMIT AND CHAIN",
			"ROLLBACK",
		},
		"failed inside a savepoint": {
			"START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ WRITE, DEFERRABLE; SET TRANSACTION READ ONLY",
			"SAVEPOINT x",
			"SET LOCAL transaction_read_only = 't'",
			"RELEASE x",
			"SAVEPOINT y",
			"SET LOCAL transaction_isolation TO DEFAULT",
			"SET TRANSACTION READ WRITE",
			"SELECT 1/0",
			"COMMIT AND CHAIN",
			"COMMIT",
		},
		"a chained transaction fails": {
			"BEGIN ISOLATION LEVEL SERIALIZABLE",
			"COMMIT AND CHAIN",
			"SET TRANSACTION READ ONLY",
			"SELECT 1/0",
			"ROLLBACK AND CHAIN",
			"COMMIT",
		},
		"a chained transaction inherits set transaction, then fails": {
			"BEGIN; SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
			"SAVEPOINT x",
			"SELECT 1/0",
			"COMMIT AND CHAIN",
			"SELECT 1/0",
			"COMMIT AND CHAIN",
			"COMMIT",
		},
		"set transaction": {
			"BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY",
			"COMMIT AND CHAIN",
			"ROLLBACK",
		},
		"a default changed in the transaction": {
			"BEGIN",
			"SET default_transaction_isolation = 'serializable'",
			"COMMIT AND CHAIN",
			"COMMIT",
			"BEGIN",
			"COMMIT AND CHAIN",
			"COMMIT",
			"RESET default_transaction_isolation",
		},
		"rollback and chain": {
			"BEGIN READ WRITE",
			"INSERT INTO chain_t VALUES (10), (11)",
			"ROLLBACK AND CHAIN",
			"INSERT INTO chain_t VALUES (12), (13)",
			"COMMIT",
		},
		"under a savepoint": {
			"BEGIN",
			"SAVEPOINT x",
			"INSERT INTO chain_t VALUES (14), (15)",
			"COMMIT AND CHAIN",
			"ROLLBACK TO x",
			"ROLLBACK",
		},
		"outside a transaction block": {
			"COMMIT AND CHAIN",
			"ROLLBACK AND CHAIN",
			"SELECT 1; COMMIT AND CHAIN",
			"INSERT INTO chain_t VALUES (16); COMMIT; INSERT INTO chain_t VALUES (17), (18); COMMIT AND CHAIN",
			"INSERT INTO chain_t VALUES (19), (20); ROLLBACK AND CHAIN; INSERT INTO chain_t VALUES (21)",
		},
		"begin with options after a set in one query string": {
			"SET application_name = 'chain'; BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO chain_t VALUES (26)",
			"COMMIT AND CHAIN",
			"COMMIT",
			"RESET application_name",
			"SELECT 1; BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO chain_t VALUES (27)",
			"ROLLBACK",
		},
		"begin inside a transaction": {
			"BEGIN; BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
			"COMMIT AND CHAIN",
			"ROLLBACK",
			"BEGIN ISOLATION LEVEL SERIALIZABLE; BEGIN READ ONLY",
			"ROLLBACK",
			"BEGIN",
			"INSERT INTO chain_t VALUES (28)",
			"START TRANSACTION READ ONLY",
			"INSERT INTO chain_t VALUES (29)",
			"ROLLBACK",
		},
		"in one query string": {
			"START TRANSACTION ISOLATION LEVEL REPEATABLE READ; INSERT INTO chain_t VALUES (22), (23); COMMIT AND CHAIN",
			"COMMIT",
			"BEGIN; INSERT INTO chain_t VALUES (24); COMMIT AND CHAIN; INSERT INTO chain_t VALUES (25); ROLLBACK",
		},
	}
	const table = "CREATE TABLE chain_t (id int PRIMARY KEY)"
	// What the client sees of a query string: each statement's tag, or the error.
	run := func(ctx context.Context, c *pgconn.PgConn, sql string) string {
		results, err := c.Exec(ctx, sql).ReadAll()
		var tags []string
		for _, r := range results {
			tags = append(tags, r.CommandTag.String())
		}
		return fmt.Sprintf("%s -> %v error %q", sql, tags, sqlState(err))
	}
	const probe = "SELECT current_setting('transaction_isolation') || ' ' || current_setting('transaction_read_only') || ' ' || current_setting('transaction_deferrable')"
	see := func(t *testing.T, dsn string, script []string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		var notices []string
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Severity+" "+n.Message) }
		c, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "TRUNCATE chain_t").ReadAll(); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sql := range script {
			notices = nil
			line := run(ctx, c, sql)
			if notices != nil {
				line += fmt.Sprintf(" notices %q", notices)
			}
			status := c.TxStatus()
			if status == 'T' {
				// Inside the transaction: its characteristics.
				res, err := c.Exec(ctx, probe).ReadAll()
				if err != nil {
					t.Fatalf("%s: %v", probe, err)
				}
				line += " in " + string(res[0].Rows[0][0])
			}
			out = append(out, fmt.Sprintf("%s; status %c", line, status))
		}
		res, err := c.Exec(ctx, "SELECT id FROM chain_t ORDER BY id").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range res[0].Rows {
			ids = append(ids, string(r[0]))
		}
		out = append(out, "rows "+strings.Join(ids, ","))
		return out
	}
	for _, mode := range poolModes {
		t.Run(mode.String(), func(t *testing.T) {
			e := startProxy(t, 2, []string{"chain_t=id"}, nil, withPoolMode(mode))
			direct := pgtest.NewDatabase(t, "chain_direct")
			ctx := context.Background()
			for _, dsn := range []string{direct, e.url("")} {
				c, err := pgconn.Connect(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Exec(ctx, table).ReadAll(); err != nil {
					t.Fatal(err)
				}
				c.Close(ctx)
			}
			perShard := make([]int64, 2)
			for name, script := range scripts {
				t.Run(name, func(t *testing.T) {
					want := see(t, direct, script)
					got := see(t, e.url(""), script)
					for i := range perShard {
						perShard[i] += queryInt(t, e.shard(t, i), "SELECT count(*) FROM chain_t")
					}
					for i := range want {
						if got[i] != want[i] {
							t.Errorf("step %d:\n proxy  %s\n direct %s", i+1, got[i], want[i])
						}
					}
					if !strings.Contains(strings.Join(want, "\n"), "AND CHAIN") {
						t.Fatal("the script has no AND CHAIN")
					}
				})
			}
			// Both shards got rows: the chained transactions spanned data sources.
			for i, n := range perShard {
				if n == 0 {
					t.Errorf("shard %d got no rows", i)
				}
			}
		})
	}
}
