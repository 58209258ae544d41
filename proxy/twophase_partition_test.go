package proxy_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
)

// TestTwoPhaseAcrossAPartition: the network to one shard's host is cut (packets
// dropped, no reset) between the phases of a two-phase commit over two shards. Cut
// after the decision (the participant's COMMIT PREPARED never arrives), the client is
// told the transaction committed; cut before it (the coordinator's COMMIT PREPARED
// never arrives), the client is told the outcome is in doubt (08007). Either way, once
// the host is back, the settler ends what was left prepared: nothing stays in doubt,
// and the transaction's two rows are both there or, only when the client was not told
// it committed, both absent.
func TestTwoPhaseAcrossAPartition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cut    int    // the data source behind the host that is cut off
		stage  string // when
		commit bool   // what the client must be told: committed, or in doubt
	}{
		{"participant after the decision", 1, sqlexec.StageCommitted, true},
		{"coordinator before the decision", 0, sqlexec.StagePrepared, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
			h := newHost(t)
			direct := []string{cluster.NewDatabase("tpcut_s0"), cluster.NewDatabase("tpcut_s1")}
			dsns := append([]string(nil), direct...)
			u, _ := url.Parse(direct[tc.cut])
			dsns[tc.cut] = behind(t, direct[tc.cut], h.serve(u.Host))
			e := startProxyOn(t, shardedRules(dsns, []string{"kv=k"}, nil), func(c *proxy.Config) {
				c.TwoPhase, c.SettleInterval = true, 500*time.Millisecond
				c.Pool = backend.Options{Size: 4, ConnectTimeout: 2 * time.Second, BanTime: time.Second, TCP: quickTCP}
			})
			c := e.connect(t)
			exec1(t, c, "CREATE TABLE kv (k int PRIMARY KEY, v text)")
			// A key on each data source.
			keys := [2]int{-1, -1}
			for k := 1; keys[0] < 0 || keys[1] < 0; k++ {
				exec1(t, c, "INSERT INTO kv VALUES ($1, 'x')", k)
				for i := range 2 {
					if queryInt(t, e.shard(t, i), "SELECT count(*) FROM kv WHERE k = $1", k) == 1 && keys[i] < 0 {
						keys[i] = k
					}
				}
			}

			var once sync.Once
			e.srv.Router().Committer().SetPhaseHook(func(stage string) {
				if stage == tc.stage {
					once.Do(func() { h.partition(true, true) })
				}
			})
			defer e.srv.Router().Committer().SetPhaseHook(nil)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if _, err := tx.Exec(ctx, "UPDATE kv SET v = 'moved' WHERE k = $1", k); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			err = tx.Commit(ctx)
			took := time.Since(start)
			var pe *pgconn.PgError
			switch {
			case tc.commit && err != nil:
				t.Fatalf("COMMIT after the decision, the participant cut off: %v after %v; want it committed", err, took)
			case !tc.commit && (!errors.As(err, &pe) || pe.Code != "08007"):
				t.Fatalf("COMMIT before the decision, the coordinator cut off: %v after %v; want 08007 (in doubt)", err, took)
			}
			// The pooled connection's user timeout, then the commit's three tries on
			// fresh connections, each dial bounded by the settler's connect timeout.
			if bound := quickTCP.UserTimeout + 3*sqlexec.DefaultSettleConnectTimeout + 3*time.Second; took > bound {
				t.Errorf("COMMIT took %v with a shard cut off, want within %v", took, bound)
			}
			t.Logf("COMMIT: %v after %v", err, took.Round(time.Millisecond))
			if n, ok := preparedCount(direct); !ok || n == 0 {
				t.Errorf("while the host is cut off: %d prepared (ok %v), want the cut part left prepared", n, ok)
			}

			h.heal()
			deadline := time.Now().Add(15 * time.Second)
			for {
				n, ok := preparedCount(direct)
				if ok && n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("15 s after healing, %d transactions still prepared", n)
				}
				time.Sleep(100 * time.Millisecond)
			}
			moved := 0
			for i, k := range keys {
				moved += int(queryInt(t, e.shard(t, i), "SELECT count(*) FROM kv WHERE k = $1 AND v = 'moved'", k))
			}
			switch {
			case moved == 1:
				t.Errorf("after settling, one of the two rows moved: the transaction is torn")
			case tc.commit && moved != 2:
				t.Errorf("the client was told it committed, but %d of 2 rows moved", moved)
			}
			t.Logf("after settling: %d of 2 rows moved", moved)
		})
	}
}
