package sqlexec_test

import (
	"context"
	"testing"

	"github.com/shardlab/shardlab/internal/sqldiff"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// dbRunner runs the differential suite on the SQL core itself.
type dbRunner struct{ db *sqlexec.DB }

func (r dbRunner) Extended(ctx context.Context, sql string, params []*string, binary bool) (*sqldiff.Answer, error) {
	args := sqlplan.Args{Values: make([][]byte, len(params))}
	for i, p := range params {
		if p != nil {
			args.Values[i] = []byte(*p)
		}
	}
	var formats []int16
	if binary {
		formats = []int16{1}
	}
	res, err := r.db.Exec(ctx, sql, args, formats)
	if err != nil {
		return nil, err
	}
	return sqldiff.FromFields(res.Fields, res.Rows, res.Tag.String()), nil
}

func (r dbRunner) Simple(ctx context.Context, sql string) (*sqldiff.Answer, error) {
	res, err := r.db.SimpleExec(ctx, sql)
	if err != nil {
		return nil, err
	}
	if len(res) != 1 {
		return &sqldiff.Answer{}, nil
	}
	return sqldiff.FromFields(res[0].Fields, res[0].Rows, res[0].Tag.String()), nil
}

func runDifferential(t *testing.T, layout sqldiff.Layout, options string) {
	env := sqldiff.NewEnv(t, layout, options)
	db, err := sqlexec.Open(context.Background(), env.Rules, sqlexec.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := dbRunner{db}
	env.Load(t, r)
	env.CheckPlacement(t)
	queries := append(sqldiff.Queries(), sqldiff.Random(uint64(len(layout.Name)), 60)...)
	reads := env.RunReads(t, r, queries)
	writes := env.RunWrites(t, r)
	t.Logf("%s: %d reads (%d answered equal, %d refused), %d writes (%d equal, %d refused)",
		layout.Name, reads.Total, reads.Equal, reads.Refused, writes.Total, writes.Equal, writes.Refused)
}

// TestDifferential runs the suite on the SQL core against one unsharded PostgreSQL
// database: seed 004's 2 databases x 2 tables, 3 shards, and 3 shards on databases
// whose collation is ICU's en-US (where text does not sort by its bytes).
func TestDifferential(t *testing.T) {
	for _, layout := range sqldiff.Layouts() {
		t.Run(layout.Name, func(t *testing.T) { runDifferential(t, layout, "") })
	}
	t.Run("3shards-icu", func(t *testing.T) { runDifferential(t, sqldiff.ICULayout(), sqldiff.ICUOptions) })
}
