package sqlplan_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// TestClockSlot: with Options.Clock, every clock read of a statement sent to the data
// sources becomes the caller's reading (Args.Clock): a literal in a statement without
// parameters, a parameter of its own (-1 in Target.Params) beside the client's, and
// pg_catalog.now() where the caller gave none. A select list's clock read keeps the
// column name PostgreSQL gives it. Without the option, with rules of one shard, and in
// DDL, the text stays as written. On the old code every target read each data
// source's own transaction start.
func TestClockSlot(t *testing.T) {
	ctx := context.Background()
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{Clock: true})
	at := sqlplan.ClockText(time.Date(2026, 11, 28, 15, 4, 5, 123456789, time.FixedZone("x", 3600)))
	if at != "2026-11-28 14:04:05.123456+00" {
		t.Fatalf("ClockText: %q", at)
	}
	lit := "('" + at + "'::pg_catalog.timestamptz)"

	b, err := p.Simple(ctx, "UPDATE sbtest1 SET c = now()::text, pad = CURRENT_DATE::text, k = extract(epoch FROM LOCALTIMESTAMP(2))::int WHERE id > 3")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Targets) != 2 || b.Plan.ReadsClock != true {
		t.Fatalf("targets %v, reads the clock %v", b.Targets, b.Plan.ReadsClock)
	}
	// Without a reading the statement reads each data source's own, as before.
	for _, tg := range b.Targets {
		if want := "UPDATE sbtest1 SET c = (pg_catalog.now())::text, pad = (pg_catalog.now())::pg_catalog.date::text, k = extract ('epoch' FROM (pg_catalog.now())::timestamp(2))::int WHERE id > 3"; tg.SQL != want {
			t.Errorf("no reading:\n got  %s\n want %s", tg.SQL, want)
		}
	}
	pl, lits, err := p.PlanSimple(ctx, "UPDATE sbtest1 SET c = now()::text, pad = CURRENT_DATE::text, k = extract(epoch FROM LOCALTIMESTAMP(2))::int WHERE id > 3")
	if err != nil {
		t.Fatal(err)
	}
	b, err = pl.BindSimpleArgs("UPDATE sbtest1 SET c = now()::text, pad = CURRENT_DATE::text, k = extract(epoch FROM LOCALTIMESTAMP(2))::int WHERE id > 3", lits, sqlplan.Args{Clock: at})
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range b.Targets {
		if want := "UPDATE sbtest1 SET c = " + lit + "::text, pad = " + lit + "::pg_catalog.date::text, k = extract ('epoch' FROM " + lit + "::timestamp(2))::int WHERE id > 3"; tg.SQL != want {
			t.Errorf("simple:\n got  %s\n want %s", tg.SQL, want)
		}
	}

	// A statement with parameters sends the reading as one more, in text: its text,
	// which the data sources keep prepared, stays the same.
	pl, err = p.Prepare(ctx, "INSERT INTO sbtest1 (id, k, c) VALUES ($1, $2, CURRENT_TIMESTAMP::text), ($3, $4, transaction_timestamp()::text) RETURNING id, now(), current_time(3), localtime")
	if err != nil {
		t.Fatal(err)
	}
	a, c := int32(1), int32(2)
	for sbShard(a) == sbShard(c) {
		c++
	}
	values := [][]byte{[]byte(fmt.Sprint(a)), []byte("10"), []byte(fmt.Sprint(c)), []byte("20")}
	b, err = pl.Bind(sqlplan.Args{Values: values, Formats: []int16{0}, Clock: at})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Targets) != 2 {
		t.Fatalf("targets %v", b.Targets)
	}
	for _, tg := range b.Targets {
		want := `VALUES ($1, $2, ($3::pg_catalog.timestamptz)::text) RETURNING id, ($3::pg_catalog.timestamptz) AS now, ($3::pg_catalog.timestamptz)::time (3) with time zone AS "current_time", ($3::pg_catalog.timestamptz)::time AS "localtime"`
		if !strings.HasSuffix(tg.SQL, want) {
			t.Errorf("extended:\n got  %s\n want ...%s", tg.SQL, want)
		}
		if len(tg.Params) != 3 || tg.Params[2] != -1 || tg.Params[0] != tg.RowOrder[0]*2 {
			t.Errorf("params %v, row order %v", tg.Params, tg.RowOrder)
		}
	}
	// Described without values, it reads pg_catalog.now().
	if _, sql := pl.DescribeSQL(); strings.Contains(sql, "$5") || !strings.Contains(sql, "(pg_catalog.now())::text") {
		t.Errorf("described as %s", sql)
	}

	// A statement over a broadcast table, over no table, and over one shard: the
	// reading too, so that a transaction reads one value everywhere.
	for _, sql := range []string{
		"UPDATE t_config SET v = now()::text",
		"SELECT now(), CURRENT_TIMESTAMP, now()::date",
		"SELECT now() FROM sbtest1 WHERE id = 3",
	} {
		pl, err := p.Prepare(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		b, err := pl.Bind(sqlplan.Args{Clock: at})
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range b.Targets {
			if strings.Contains(strings.ToLower(tg.SQL), "now()") || strings.Contains(tg.SQL, "CURRENT_TIMESTAMP") || !strings.Contains(tg.SQL, lit) {
				t.Errorf("%s: sent %s", sql, tg.SQL)
			}
		}
		if sql == "SELECT now(), CURRENT_TIMESTAMP, now()::date" {
			if want := "SELECT " + lit + " AS now, " + lit + " AS \"current_timestamp\", " + lit + "::date AS now"; b.Targets[0].SQL != want {
				t.Errorf("names:\n got  %s\n want %s", b.Targets[0].SQL, want)
			}
		}
	}

	// What stays as written: DDL (a default is the table's, evaluated when a row is
	// written), statement_timestamp() and clock_timestamp() (one database's differ
	// per statement and per call too), a function of the user's, and everything
	// without the option or under rules of one shard.
	for _, sql := range []string{
		"CREATE TABLE t_config2 (at timestamptz DEFAULT now())",
		"UPDATE sbtest1 SET c = statement_timestamp()::text, pad = clock_timestamp()::text",
		"UPDATE sbtest1 SET c = myschema.now()::text",
	} {
		b, err := p.Simple(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range b.Targets {
			if strings.Contains(tg.SQL, "pg_catalog.timestamptz") || strings.Contains(tg.SQL, "pg_catalog.now()") {
				t.Errorf("%s: sent %s", sql, tg.SQL)
			}
		}
	}
	one, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://a/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []*sqlplan.Planner{sqlplan.New(testRules(t), nil, sqlplan.Options{}), sqlplan.New(one, nil, sqlplan.Options{Clock: true})} {
		pl, err := q.Prepare(ctx, "SELECT now() FROM t_config")
		if err != nil {
			t.Fatal(err)
		}
		b, err := pl.Bind(sqlplan.Args{Clock: at})
		if err != nil {
			t.Fatal(err)
		}
		if pl.ReadsClock || b.Targets[0].SQL != "SELECT now() FROM t_config" {
			t.Errorf("rewritten where it should not be: %v %q", pl.ReadsClock, b.Targets[0].SQL)
		}
	}
}
