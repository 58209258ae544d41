package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/reshard"
)

// inSchema is dsn with search_path set to schema, which it makes there first.
func inSchema(t *testing.T, dsn, schema string) string {
	t.Helper()
	exec(t, dsn, "CREATE SCHEMA IF NOT EXISTS "+schema)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestMoveAggregated grows a deployment whose two data sources are schemas of one
// database (s0 and s1), served by a proxy that aggregates them into one pool, to four
// data sources: the two schemas, and schemas s0 and s1 of a second database (logical
// replication carries a table into the table of the same schema and name), so that two
// streams run from the first database into the second. The tables of s0 there are
// made by the move (pg_dump, through a DSN that names its search_path); s1 has them.
// Clients transfer money and a reader counts the accounts through the proxy the whole
// time. No client fails, the count
// never changes, the proxy keeps one pool per database within its size before, during
// and after the cutover, through a revert and through the move made again and
// finished, and after the finish every account is where the new layout places it. A
// move whose destination reads another schema than the source's is refused before
// anything is made.
func TestMoveAggregated(t *testing.T) {
	c := logicalCluster(t)
	a, b := c.NewDatabase("reshard"), c.NewDatabase("reshard")
	dsns := []string{inSchema(t, a, "s0"), inSchema(t, a, "s1"), inSchema(t, b, "s0"), inSchema(t, b, "s1")}
	const rows = 1000
	fill(t, dsns[:2], 2, 100)
	withAccountsOn(t, dsns, rows)
	exec(t, dsns[3], "CREATE TABLE people (id bigint PRIMARY KEY, name text)", "CREATE TABLE countries (code text PRIMARY KEY, name text)",
		"CREATE TABLE accounts (id bigint PRIMARY KEY, bal bigint NOT NULL)")
	for _, d := range dsns[2:] {
		exec(t, d, "CREATE TABLE hash_oracle (id bigint) PARTITION BY HASH (id)")
	}
	from, to := layout(t, dsns[:2], withAccounts), layout(t, dsns, withAccounts)
	ctx := context.Background()

	// Refused, and nothing made: a destination that reads another schema.
	wrongSchema := layout(t, []string{dsns[0], dsns[1], inSchema(t, b, "s2"), dsns[3]}, withAccounts)
	if _, err := reshard.Start(ctx, from, wrongSchema, reshard.CopyOptions{}); err == nil || !strings.Contains(err.Error(), "data source ds_2 reads accounts in schema s2") ||
		!strings.Contains(err.Error(), "give ds_2 a search_path that reads schema s0") {
		t.Errorf("a move into a data source that reads schema s2: %v, want it refused", err)
	} else {
		t.Log(err)
	}
	for _, d := range []string{a, b} {
		if n := queryInt(t, d, "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) + (SELECT count(*) FROM pg_replication_slots)"); n != 0 {
			t.Fatalf("a refused start left %d publications, subscriptions or slots", n)
		}
	}

	// The plan says where each new schema's copy of the broadcast table comes from.
	p, err := reshard.MakePlan(ctx, from, to, reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "copied from ds_0.countries to ds_2; from ds_1.countries to ds_3") {
		t.Errorf("the plan does not say that each schema's broadcast table comes from the old data source of its schema:\n%s", text.String())
	}

	const poolSize = 4
	addr, srv, err := serve(t, from, func(c *proxy.Config) { c.Aggregate, c.Pool.Size = true, poolSize })
	if err != nil {
		t.Fatal(err)
	}
	// One pool per database, each within its size, sampled until stop.
	stop := make(chan struct{})
	pools := make(chan error, 1)
	go func() {
		var bad error
		for {
			for _, p := range srv.Stats().Pools {
				if open := p.InUse + p.Idle; open > int64(p.Size) || p.Size != poolSize {
					bad = errors.Join(bad, fmt.Errorf("pool %s: %d connections open, size %d", p.DataSource, open, p.Size))
				}
			}
			select {
			case <-stop:
				pools <- bad
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	poolsOf := func() []string {
		var out []string
		for _, p := range srv.Stats().Pools {
			out = append(out, p.DataSource)
		}
		return out
	}
	if got := poolsOf(); len(got) != 1 {
		t.Fatalf("pools before the move: %v, want one for the database of both schemas", got)
	}

	cl := newClients(t, addr)
	cl.transfers(4, rows)
	cl.reader(rows)
	toPath := rulesFile(t, to)
	// The move, cut over and reverted, then again, cut over and finished.
	for _, end := range []string{"RESHARD REVERT", "RESHARD FINISH"} {
		startMove(t, from, to, reshard.CopyOptions{})
		time.Sleep(300 * time.Millisecond)
		if _, err := cl.admin("RESHARD CUTOVER '" + toPath + "'"); err != nil {
			cl.halt()
			t.Fatalf("RESHARD CUTOVER: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		if got := poolsOf(); len(got) != 2 {
			t.Errorf("pools after the cutover: %v, want one per database (2)", got)
		}
		if _, err := cl.admin(end); err != nil {
			cl.halt()
			t.Fatalf("%s: %v", end, err)
		}
		time.Sleep(300 * time.Millisecond)
		if want := map[string]int{"RESHARD REVERT": 1, "RESHARD FINISH": 2}[end]; len(poolsOf()) != want {
			t.Errorf("pools after %s: %v, want %d", end, poolsOf(), want)
		}
	}
	cl.halt()
	close(stop)
	if err := <-pools; err != nil {
		t.Error(err)
	}
	t.Logf("%d transfers, %d counts; pools %v", cl.txs.Load(), cl.reads.Load(), poolsOf())
	if cl.txs.Load() == 0 || cl.reads.Load() == 0 {
		t.Errorf("%d transfers and %d counts: the clients did nothing", cl.txs.Load(), cl.reads.Load())
	}

	// Every account in the schema the new layout places it in, and in no other.
	total, money := int64(0), int64(0)
	for k, d := range dsns {
		all := queryInt(t, d, "SELECT count(*) FROM accounts")
		owned := queryInt(t, d, fmt.Sprintf("SELECT count(*) FROM accounts WHERE satisfies_hash_partition('hash_oracle'::regclass, 4, %d, id)", k))
		if all != owned {
			t.Errorf("ds_%d holds %d accounts, %d of them its own by the new layout", k, all, owned)
		}
		total += all
		money += queryInt(t, d, "SELECT coalesce(sum(bal), 0) FROM accounts")
	}
	if total != rows || money != rows*100 {
		t.Errorf("the data sources hold %d accounts with %d in all, want %d with %d", total, money, rows, rows*100)
	}
	for _, d := range dsns[2:] {
		if n := queryInt(t, d, "SELECT count(*) FROM countries"); n != 3 {
			t.Errorf("the broadcast table on %s holds %d rows, want 3", d, n)
		}
	}
}
