package reshard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// shrunk is the target of a move of 4 data sources to 3 new ones: ds_0 stays, the
// default data source (holding the tables no rule names) and a copy of the broadcast
// ones, and the sharded tables go to ds_4, ds_5 and ds_6 only.
func shrunk(t *testing.T, dsns []string) *rules.Compiled {
	t.Helper()
	return layout(t, []string{dsns[0], dsns[4], dsns[5], dsns[6]}, withAccounts, func(r *rules.Rules) {
		for i := range r.DataSources[1:] {
			r.DataSources[i+1].Name = fmt.Sprintf("ds_%d", i+4)
		}
		for i := range r.Tables {
			r.Tables[i].DataSources = []string{"ds_4", "ds_5", "ds_6"}
		}
	})
}

// shrinkCluster is a throwaway cluster that can carry a move of 4 data sources to 3:
// twelve streams, each with its table synchronization workers.
func shrinkCluster(t *testing.T) *pgtest.Cluster {
	return pgtest.StartClusterWith(t, "wal_level = logical", "max_logical_replication_workers = 40", "max_worker_processes = 48",
		"max_replication_slots = 40", "max_wal_senders = 40")
}

// fillAccounts makes the accounts table on each of dsns, rows accounts of 100 placed as
// PostgreSQL's own hash partitioning of modulus len(dsns) places them.
func fillAccounts(t *testing.T, dsns []string, rows int) {
	t.Helper()
	for i, d := range dsns {
		exec(t, d, "CREATE TABLE accounts (id bigint PRIMARY KEY, bal bigint NOT NULL)",
			fmt.Sprintf(`INSERT INTO accounts SELECT g, 100 FROM generate_series(1, %d) g
				WHERE satisfies_hash_partition('hash_oracle'::regclass, %d, %d, g::bigint)`, rows, len(dsns), i))
	}
}

// placedBy checks that the data sources dsns hold exactly rows accounts holding 100
// each in all and people 1..people, each row on the data source PostgreSQL's own hash
// partitioning of modulus len(dsns) places it on, and that the others hold none.
func placedBy(t *testing.T, dsns, others []string, rows, people int64) {
	t.Helper()
	ctx := context.Background()
	var accounts, money, persons int64
	for k, d := range dsns {
		cn, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		var n, s, p, stray int64
		if err := cn.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM accounts), (SELECT coalesce(sum(bal), 0) FROM accounts), (SELECT count(*) FROM people),
			(SELECT count(*) FROM accounts WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, %[1]d, %[2]d, id))
			+ (SELECT count(*) FROM people WHERE NOT satisfies_hash_partition('hash_oracle'::regclass, %[1]d, %[2]d, id))`, len(dsns), k)).Scan(&n, &s, &p, &stray); err != nil {
			t.Fatal(err)
		}
		cn.Close(ctx)
		if stray != 0 {
			t.Errorf("%s holds %d rows a layout of %d places elsewhere", d, stray, len(dsns))
		}
		accounts, money, persons = accounts+n, money+s, persons+p
	}
	if accounts != rows || money != rows*100 || persons != people {
		t.Errorf("the %d data sources hold %d accounts with %d and %d people, want %d with %d and %d", len(dsns), accounts, money, persons, rows, rows*100, people)
	}
	for _, d := range others {
		n := queryString(t, d, "SELECT count(*) FROM people")
		if queryString(t, d, "SELECT (to_regclass('accounts') IS NOT NULL)::text") == "true" {
			n += "+" + queryString(t, d, "SELECT count(*) FROM accounts")
		}
		if n != "0" && n != "0+0" {
			t.Errorf("%s, which the layout in force does not use, holds people+accounts %s", d, n)
		}
	}
	for _, d := range append(dsns, others...) {
		if n := queryString(t, d, `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) +
			(SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_views WHERE viewname LIKE '%shardlab%') +
			(SELECT count(*) FROM pg_event_trigger)`); n != "0" {
			t.Errorf("%s: %s publications, subscriptions, slots, views or event triggers of the move are left", d, n)
		}
	}
}

// TestShrinkFourToThree moves a deployment of 4 data sources to 3 new ones through a
// running proxy while clients transfer money and a reader counts the accounts: twelve
// streams (each old data source sends rows to each new one), a cutover, a revert back
// to the 4 (twelve streams back), then the move again, cut over and finished. No
// client transaction fails, the count never changes, every row ends where the layout
// in force places it by PostgreSQL's own hash partitioning, and nothing of the moves
// is left.
func TestShrinkFourToThree(t *testing.T) {
	c7 := shrinkCluster(t)
	var dsns []string
	for range 7 {
		dsns = append(dsns, c7.NewDatabase("shrink"))
	}
	const rows, people = 3000, 400
	fill(t, dsns, 4, people)
	fillAccounts(t, dsns[:4], rows)
	from, to := layout(t, dsns[:4], withAccounts), shrunk(t, dsns)
	toPath := rulesFile(t, to)
	p, err := reshard.MakePlan(context.Background(), from, to, reshard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Streams) != 12 {
		t.Errorf("%d streams, want 12 (each of 4 data sources to each of 3)", len(p.Streams))
	}
	addr, srv, err := serve(t, from)
	if err != nil {
		t.Fatal(err)
	}
	startMove(t, from, to, reshard.CopyOptions{})
	c := newClients(t, addr)
	c.transfers(3, rows)
	c.reader(rows)
	progressed := func(what string) {
		t.Helper()
		before, reads := c.txs.Load(), c.reads.Load()
		time.Sleep(500 * time.Millisecond)
		if c.txs.Load() == before || c.reads.Load() == reads {
			t.Errorf("no transfer or count %s", what)
		}
	}
	step := func(sql string) {
		t.Helper()
		res, err := c.admin(sql)
		if err != nil {
			c.halt()
			t.Fatalf("%s: %v", sql, err)
		}
		for _, row := range res[0].Rows {
			t.Logf("%s: %s: %s", sql, row[0], row[1])
		}
	}
	progressed("before the cutover")
	step("RESHARD CUTOVER '" + toPath + "'")
	progressed("after the cutover")
	// The new layout writes the broadcast table on ds_0 and the new data sources only:
	// the revert must bring ds_1 .. ds_3 up to date too.
	bc := c.connect()
	if _, err := bc.Exec(context.Background(), "UPDATE countries SET name = 'Nippon' WHERE code = 'jp'"); err != nil {
		t.Fatal(err)
	}
	if _, err := bc.Exec(context.Background(), "INSERT INTO countries VALUES ('it', 'Italy')"); err != nil {
		t.Fatal(err)
	}
	bc.Close(context.Background())
	step("RESHARD REVERT")
	progressed("after the revert")
	c.halt()
	if got := srv.Router().Rules().Digest(); got != from.Digest() {
		t.Fatalf("the proxy routes by %s after the revert, want the old layout %s", got, from.Digest())
	}
	placedBy(t, dsns[:4], dsns[4:], rows, people)
	for k, d := range dsns[:4] {
		if got := queryString(t, d, "SELECT string_agg(code || ' ' || name, ', ' ORDER BY code) FROM countries"); got != "de Germany, fr France, it Italy, jp Nippon" {
			t.Errorf("ds_%d after the revert holds the countries %s, not those written since the cutover", k, got)
		}
	}

	startMove(t, from, to, reshard.CopyOptions{})
	c = newClients(t, addr)
	c.transfers(3, rows)
	c.reader(rows)
	step("RESHARD CUTOVER '" + toPath + "'")
	progressed("after the second cutover")
	step("RESHARD FINISH")
	progressed("after the finish")
	c.halt()
	if got := srv.Router().Rules().Digest(); got != to.Digest() {
		t.Fatalf("the proxy routes by %s after the finish, want the target %s", got, to.Digest())
	}
	placedBy(t, dsns[4:], dsns[:4], rows, people)
}
