package sqlexec_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/sqlexec"
)

// BenchmarkTimeToSettle measures how long a two-phase transaction stays in doubt once
// whatever left it there is over, with the coordinator running throughout:
//
//   - terminated: the backends of a participant's data source are terminated between
//     the phases; the time from the termination until its part is committed (the
//     commit's own try on a fresh connection);
//   - outage: a participant's server stops after the decision and starts again; the
//     time from the restart until its part is committed (the settler's loop);
//   - killed: a second coordinator (a child process) is killed with SIGKILL after the
//     decision; the time from the kill until this coordinator's settler has committed
//     the parts it left.
//
// Each reports the median and the largest time over its iterations (ms), and the
// settler's interval. An iteration begins right after a pass, so the restart and the
// kill wait a random share of the interval first: they fall anywhere between passes. docs/proxy.md and docs/shardsql.md quote it:
//
//	SHARDLAB_PG_DSN=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable \
//	  go test -run XXX -bench TimeToSettle -benchtime 10x ./sqlexec
func BenchmarkTimeToSettle(b *testing.B) {
	up := pgtest.StartClusterWith(b, "max_prepared_transactions = 20")
	down := pgtest.StartClusterWith(b, "max_prepared_transactions = 20")
	for _, interval := range []time.Duration{sqlexec.DefaultSettleInterval, 250 * time.Millisecond} {
		b.Run("terminated/interval="+interval.String(), func(b *testing.B) {
			dsns := []string{up.NewDatabase("tts_term0"), up.NewDatabase("tts_term1")}
			db := openBank(b, dsns, interval)
			var terminatedAt time.Time
			db.Committer().SetPhaseHook(func(stage string) {
				if stage == sqlexec.StageCommitted {
					if _, err := terminateOthers(dsns[1]); err != nil {
						b.Error(err)
					}
					terminatedAt = time.Now()
				}
			})
			var took []time.Duration
			for b.Loop() {
				if err := transferUntilCommit(db, 0, 1); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(terminatedAt))
				if p := preparedOn(b, dsns); p != 0 {
					b.Fatalf("%d prepared after the commit returned", p)
				}
			}
			report(b, took, interval)
		})
		b.Run("outage/interval="+interval.String(), func(b *testing.B) {
			dsns := []string{up.NewDatabase("tts_out0"), down.NewDatabase("tts_out1")}
			db := openBank(b, dsns, interval)
			stop := false
			db.Committer().SetPhaseHook(func(stage string) {
				if stage == sqlexec.StageCommitted && stop {
					down.Stop()
					stop = false
				}
			})
			var took []time.Duration
			for b.Loop() {
				stop = true
				if err := transferUntilCommit(db, 0, 1); err != nil {
					b.Fatal(err)
				}
				// A random share of the interval, so that the restart falls anywhere
				// between two passes (an iteration begins right after a pass).
				time.Sleep(time.Second + rand.N(interval))
				down.Start()
				took = append(took, untilNoPrepared(b, dsns[1:]))
			}
			report(b, took, interval)
		})
		b.Run("killed/interval="+interval.String(), func(b *testing.B) {
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, up.NewDatabase(fmt.Sprintf("tts_kill%d", i)))
			}
			db, err := sqlexec.Open(context.Background(), kvRules(b, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: interval})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			if _, err := db.SimpleExec(context.Background(), "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
				b.Fatal(err)
			}
			var took []time.Duration
			for b.Loop() {
				if _, err := db.SimpleExec(context.Background(), "DELETE FROM kv"); err != nil {
					b.Fatal(err)
				}
				time.Sleep(rand.N(interval)) // the kill falls anywhere between two passes
				killChild(b, sqlexec.StageCommitted, dsns)
				took = append(took, untilNoPrepared(b, dsns))
			}
			report(b, took, interval)
		})
	}
}

// openBank opens a two-phase DB over dsns with table kv (k int, v int) holding one
// account per data source.
func openBank(b *testing.B, dsns []string, interval time.Duration) *sqlexec.DB {
	b.Helper()
	ctx := context.Background()
	db, err := sqlexec.Open(ctx, kvRules(b, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: interval})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v int NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	for k := range dsns {
		if _, err := db.Exec(ctx, "INSERT INTO kv VALUES ($1, 100)", text(strconv.Itoa(k)), nil); err != nil {
			b.Fatal(err)
		}
	}
	return db
}

// transferUntilCommit runs a transfer, retrying one that fails before its commit (a
// pooled connection whose backend an earlier iteration terminated).
func transferUntilCommit(db *sqlexec.DB, from, to int) error {
	for attempt := 0; ; attempt++ {
		err := transfer(context.Background(), db, from, to)
		if err == nil || attempt == 20 || !errors.Is(err, errBeforeCommit) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// terminateOthers ends every other backend of the database dsn names.
func terminateOthers(dsn string) (int, error) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&n)
	return n, err
}

// preparedOn counts the prepared transactions of the databases.
func preparedOn(tb testing.TB, dsns []string) int {
	tb.Helper()
	n := 0
	for _, p := range preparedNow(dsns) {
		if p < 0 {
			tb.Fatal("a database cannot be reached")
		}
		n += p
	}
	return n
}

// untilNoPrepared polls the databases every 5 ms over one connection each until none
// holds a prepared transaction, and returns how long that took.
func untilNoPrepared(tb testing.TB, dsns []string) time.Duration {
	tb.Helper()
	start := time.Now()
	ctx := context.Background()
	conns := make([]*pgx.Conn, len(dsns))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(ctx)
			}
		}
	}()
	for {
		n := 0
		for i, d := range dsns {
			if conns[i] == nil {
				c, err := pgx.Connect(ctx, d)
				if err != nil {
					n++
					continue
				}
				conns[i] = c
			}
			var p int
			if err := conns[i].QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&p); err != nil {
				conns[i].Close(ctx)
				conns[i], p = nil, 1
			}
			n += p
		}
		if n == 0 {
			return time.Since(start)
		}
		if time.Since(start) > time.Minute {
			tb.Fatal("still prepared after a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// report sets the benchmark's metrics: the median and largest time to settle, in ms.
func report(b *testing.B, took []time.Duration, interval time.Duration) {
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(took[len(took)/2]), "median-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
	b.ReportMetric(ms(interval), "interval-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d runs, sorted (ms): %v", len(took), took)
}
