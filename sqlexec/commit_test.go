package sqlexec_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// kvRulesValue spreads table kv (k int primary key, v text) over the data sources by
// k mod n.
func kvRulesValue(dsns []string) rules.Rules {
	r := rules.Rules{Tables: []rules.Table{{Name: "kv", Strategy: rules.Strategy{Column: "k", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	return r
}

func kvRules(t testing.TB, dsns []string) *rules.Compiled {
	t.Helper()
	c, err := rules.Compile(kvRulesValue(dsns))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func text(vals ...string) sqlplan.Args {
	a := sqlplan.Args{}
	for _, v := range vals {
		a.Values = append(a.Values, []byte(v))
	}
	return a
}

// countOn returns how many kv rows, and how many prepared transactions, each database
// holds, read straight from the databases.
func countOn(t *testing.T, dsns []string) (rows, prepared []int) {
	t.Helper()
	ctx := context.Background()
	for _, d := range dsns {
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		var n, p int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM kv").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
		rows, prepared = append(rows, n), append(prepared, p)
	}
	return rows, prepared
}

// TestTransactionsTouchEveryShard: a transaction commits, or rolls back, on every data
// source it touched, and joins a data source only when a statement needs it.
func TestTransactionsTouchEveryShard(t *testing.T) {
	ctx := context.Background()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("tx%d", i)))
	}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES ($1, 'a')", text("1"), nil); err != nil {
		t.Fatal(err)
	}
	if got := tx.Touched(); len(got) != 1 || got[0] != 1 {
		t.Errorf("after one insert the transaction holds data sources %v, want [1]", got)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES ($1, 'b'), ($2, 'c')", text("3", "5"), nil); err != nil {
		t.Fatal(err)
	}
	if rows, _ := countOn(t, dsns); rows[0]+rows[1]+rows[2] != 0 {
		t.Errorf("uncommitted rows are visible: %v", rows)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, _ := countOn(t, dsns); rows[0]+rows[1]+rows[2] != 0 {
		t.Errorf("rolled back rows are there: %v", rows)
	}
	tx, _ = db.Begin(ctx)
	for _, k := range []string{"0", "1", "2", "4"} {
		if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES ($1, 'x')", text(k), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, _ := countOn(t, dsns); rows[0] != 1 || rows[1] != 2 || rows[2] != 1 {
		t.Errorf("committed rows per shard %v, want [1 2 1]", rows)
	}
	// A failed statement aborts the whole transaction, as in PostgreSQL.
	tx, _ = db.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO kv VALUES ($1, 'y')", text("6"), nil)
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES ($1, 'dup')", text("0"), nil); sqlplan.Code(err) != "23505" {
		t.Fatalf("duplicate key: %v", err)
	}
	if _, err := tx.Exec(ctx, "SELECT * FROM kv WHERE k = $1", text("1"), nil); sqlplan.Code(err) != "25P02" {
		t.Errorf("a statement after a failure: %v, want 25P02", err)
	}
	if err := tx.Commit(ctx); sqlplan.Code(err) != "40000" {
		t.Errorf("commit of an aborted transaction: %v, want 40000", err)
	}
	if rows, _ := countOn(t, dsns); rows[0] != 2-1 || rows[1]+rows[2] != 3 {
		t.Errorf("after the aborted transaction: %v", rows)
	}
}

// TestTwoPhaseCommit commits a transaction over three data sources with PREPARE
// TRANSACTION and leaves nothing prepared behind.
func TestTwoPhaseCommit(t *testing.T) {
	ctx := context.Background()
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("tp%d", i)))
	}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	tx, _ := db.Begin(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c')", sqlplan.Args{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, prepared := countOn(t, dsns)
	if fmt.Sprint(rows) != "[1 1 1]" || fmt.Sprint(prepared) != "[0 0 0]" {
		t.Errorf("rows %v, prepared %v", rows, prepared)
	}
	// An autocommit write to several shards goes through two-phase commit too.
	if _, err := db.Exec(ctx, "UPDATE kv SET v = 'z'", sqlplan.Args{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, prepared := countOn(t, dsns); fmt.Sprint(prepared) != "[0 0 0]" {
		t.Errorf("prepared left after an autocommit write: %v", prepared)
	}
}

// TestTwoPhaseRecoveryAfterKill kills a process between the phases of a two-phase
// commit (SIGKILL: no clean-up runs), then opens the database again: recovery must
// leave no prepared transaction and no half-applied write. Killed after every data
// source prepared, the transaction rolls back; killed after the coordinator committed,
// it commits everywhere.
func TestTwoPhaseRecoveryAfterKill(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	for _, stage := range []string{sqlexec.StagePrepared, sqlexec.StageCommitted} {
		t.Run(stage, func(t *testing.T) {
			ctx := context.Background()
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("kill_%s_%d", stage, i)))
			}
			db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
			db.Close()

			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "SHARDLAB_2PC_CHILD="+stage, "SHARDLAB_2PC_DSNS="+strings.Join(dsns, " "))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			reached := make(chan bool)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if sc.Text() == "STAGE "+stage {
						reached <- true
						return
					}
				}
				reached <- false
			}()
			select {
			case ok := <-reached:
				if !ok {
					t.Fatal("the child ended before reaching the stage")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the child did not reach the stage")
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()

			rows, prepared := countOn(t, dsns)
			t.Logf("after the kill: rows %v, prepared %v", rows, prepared)
			want := 3
			if stage == sqlexec.StageCommitted {
				if rows[0] != 1 || prepared[1]+prepared[2] != 2 {
					t.Fatalf("the kill came at the wrong moment: rows %v, prepared %v", rows, prepared)
				}
			} else {
				want = 0
				if prepared[0]+prepared[1]+prepared[2] != 3 {
					t.Fatalf("the kill came at the wrong moment: prepared %v", prepared)
				}
			}
			db, err = sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true}) // runs Recover
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			rows, prepared = countOn(t, dsns)
			if rows[0]+rows[1]+rows[2] != want || prepared[0]+prepared[1]+prepared[2] != 0 {
				t.Errorf("after recovery: rows %v (want %d in all), prepared %v (want none)", rows, want, prepared)
			}
			c, r, err := db.Recover(ctx)
			if err != nil || c+r != 0 {
				t.Errorf("a second recovery found work: %d committed, %d rolled back, %v", c, r, err)
			}
		})
	}
}

// TestMain runs the process TestTwoPhaseRecoveryAfterKill kills when the environment
// asks for it, and the tests otherwise.
func TestMain(m *testing.M) {
	if stage := os.Getenv("SHARDLAB_2PC_CHILD"); stage != "" {
		twoPhaseChild(stage)
		return
	}
	os.Exit(m.Run())
}

// twoPhaseChild starts a two-phase commit and pauses at stage, to be killed there.
func twoPhaseChild(stage string) {
	ctx := context.Background()
	c, err := rules.Compile(kvRulesValue(strings.Fields(os.Getenv("SHARDLAB_2PC_DSNS"))))
	if err != nil {
		log.Fatal(err)
	}
	db, err := sqlexec.Open(ctx, c, sqlexec.Config{TwoPhase: true})
	if err != nil {
		log.Fatal(err)
	}
	db.Committer().SetPhaseHook(func(s string) {
		if s == stage {
			fmt.Printf("STAGE %s\n", s)
			os.Stdout.Sync()
			time.Sleep(time.Hour) // SIGKILL comes first
		}
	})
	tx, _ := db.Begin(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c')", sqlplan.Args{}, nil); err != nil {
		log.Fatal(err)
	}
	log.Fatalf("the commit returned (%v) instead of pausing", tx.Commit(ctx))
}
