package shardsql_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/shardsql"
	"github.com/shardlab/shardlab/sqlexec"
)

// TestMain runs the process TestTwoPhaseRecoveryAfterKill kills when asked to.
func TestMain(m *testing.M) {
	if stage := os.Getenv("SHARDSQL_2PC_CHILD"); stage != "" {
		twoPhaseChild(stage, strings.Fields(os.Getenv("SHARDSQL_2PC_DSNS")))
		return
	}
	os.Exit(m.Run())
}

func kvValue(dsns []string) rules.Rules {
	r := rules.Rules{Tables: []rules.Table{{Name: "kv", Strategy: rules.Strategy{Column: "k", Type: rules.TypeInt4, Algorithm: rules.AlgorithmMod}}}}
	for i, d := range dsns {
		r.DataSources = append(r.DataSources, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: d})
	}
	return r
}

// twoPhaseChild writes to every shard in one transaction through database/sql and
// pauses at stage of the two-phase commit, to be killed there.
func twoPhaseChild(stage string, dsns []string) {
	c, err := rules.Compile(kvValue(dsns))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := shardsql.NewConnector(context.Background(), shardsql.Config{Rules: c, TwoPhase: true})
	if err != nil {
		log.Fatal(err)
	}
	conn.SetPhaseHook(func(s string) {
		if s == stage {
			fmt.Printf("STAGE %s\n", s)
			os.Stdout.Sync()
			time.Sleep(time.Hour) // SIGKILL comes first
		}
	})
	db := shardsql.OpenDB(conn)
	tx, err := db.Begin()
	if err != nil {
		log.Fatal(err)
	}
	for k := range 3 {
		if _, err := tx.Exec("INSERT INTO kv VALUES ($1, 'x')", k); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatalf("the commit returned (%v) instead of pausing", tx.Commit())
}

func prepared(t *testing.T, dsns []string) []int {
	t.Helper()
	var out []int
	for _, d := range dsns {
		db, _ := sql.Open("pgx", d)
		var n int
		if err := db.QueryRow("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.Close()
		out = append(out, n)
	}
	return out
}

// TestTwoPhaseRecoveryAfterKill kills a program using the driver with TwoPhase between
// prepare and commit (SIGKILL), and again after the coordinator committed; opening the
// driver again recovers: no prepared transaction is left and no write is half applied.
func TestTwoPhaseRecoveryAfterKill(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	for _, stage := range []string{sqlexec.StagePrepared, sqlexec.StageCommitted} {
		t.Run(stage, func(t *testing.T) {
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("drv_kill_%s_%d", stage, i)))
			}
			db := openDriver(t, kv(t, dsns), true)
			if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
			db.Close()

			killDriverChild(t, stage, dsns)
			if p := prepared(t, dsns); p[0]+p[1]+p[2] == 0 {
				t.Fatalf("nothing was left prepared by the kill: %v", p)
			}

			db = openDriver(t, kv(t, dsns), true) // recovers
			if err := db.Ping(); err != nil {
				t.Fatal(err)
			}
			rows := countRows(t, dsns)
			want := "[1 1 1]"
			if stage == sqlexec.StagePrepared {
				want = "[0 0 0]"
			}
			if fmt.Sprint(rows) != want {
				t.Errorf("rows per shard after recovery %v, want %s", rows, want)
			}
			if p := prepared(t, dsns); fmt.Sprint(p) != "[0 0 0]" {
				t.Errorf("prepared transactions left after recovery: %v", p)
			}
		})
	}
}

// killDriverChild runs twoPhaseChild in a child process and kills it (SIGKILL) when it
// reaches stage.
func killDriverChild(t *testing.T, stage string, dsns []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SHARDSQL_2PC_CHILD="+stage, "SHARDSQL_2PC_DSNS="+strings.Join(dsns, " "))
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reached := make(chan bool, 1)
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
			t.Fatal("the child ended before the stage")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the child did not reach the stage")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
}

// settleSlack is what settling may take beyond the settler's interval: a commit's tries
// on fresh connections and one pass on a loaded two-core machine.
const settleSlack = 2 * time.Second

// waitNoPrepared polls pg_prepared_xacts until no database holds a prepared
// transaction, failing the test unless that happens within limit.
func waitNoPrepared(t *testing.T, dsns []string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		p := prepared(t, dsns)
		n := 0
		for _, v := range p {
			n += v
		}
		if n == 0 {
			break
		}
		if time.Since(start) > limit {
			t.Fatalf("prepared transactions %v left %v after they were in doubt", p, time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// TestTwoPhaseSettledWhileOpen: a program using the driver with TwoPhase settles, while
// it runs, the transactions that another program using the driver left when it was
// killed between the phases, and its own commits survive the termination of a data
// source's backends between the phases; no reopening is needed.
func TestTwoPhaseSettledWhileOpen(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	for _, stage := range []string{sqlexec.StagePrepared, sqlexec.StageCommitted} {
		t.Run("killed at "+stage, func(t *testing.T) {
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("drv_open_%s_%d", stage, i)))
			}
			conn, err := shardsql.NewConnector(context.Background(), shardsql.Config{Rules: kv(t, dsns), TwoPhase: true})
			if err != nil {
				t.Fatal(err)
			}
			db := shardsql.OpenDB(conn)
			defer db.Close()
			if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
			killDriverChild(t, stage, dsns)
			took := waitNoPrepared(t, dsns, sqlexec.DefaultSettleInterval+settleSlack)
			t.Logf("settled %v after the kill", took)
			want := "[1 1 1]"
			if stage == sqlexec.StagePrepared {
				want = "[0 0 0]"
			}
			if rows := countRows(t, dsns); fmt.Sprint(rows) != want {
				t.Errorf("rows per shard %v, want %s", rows, want)
			}
			if st := conn.Settler().Stats(); st.Committed+st.RolledBack == 0 || st.InDoubt != 0 {
				t.Errorf("settler stats %+v", st)
			}
		})
	}
	t.Run("terminated backends", func(t *testing.T) {
		var dsns []string
		for i := range 3 {
			dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("drv_term_%d", i)))
		}
		var terminate atomic.Bool
		hookErr := make(chan error, 10)
		conn, err := shardsql.NewConnector(context.Background(), shardsql.Config{Rules: kv(t, dsns), TwoPhase: true})
		if err != nil {
			t.Fatal(err)
		}
		conn.SetPhaseHook(func(stage string) {
			if stage == sqlexec.StagePrepared && terminate.CompareAndSwap(true, false) {
				c, err := sql.Open("pgx", dsns[1])
				if err == nil {
					_, err = c.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
					c.Close()
				}
				if err != nil {
					hookErr <- err
				}
			}
		})
		db := shardsql.OpenDB(conn)
		defer db.Close()
		if _, err := db.Exec("CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
			t.Fatal(err)
		}
		for round := range 5 {
			terminate.Store(true)
			var err error
			for attempt := 0; attempt < 20; attempt++ {
				// A statement that waits 10 s fails the test: a prepared
				// transaction left behind holds what it needs.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var tx *sql.Tx
				if tx, err = db.BeginTx(ctx, nil); err != nil {
					cancel()
					continue
				}
				if _, err = tx.ExecContext(ctx, "INSERT INTO kv VALUES ($1, 'x'), ($2, 'y')", 3*round, 3*round+1); err != nil {
					tx.Rollback() // a pooled connection terminated by the last round
					blocked := ctx.Err() != nil
					cancel()
					if blocked {
						t.Fatalf("round %d: the insert waited 10 s: %v", round, err)
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				err = tx.Commit()
				cancel()
				break
			}
			if err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		select {
		case err := <-hookErr:
			t.Fatal(err)
		default:
		}
		waitNoPrepared(t, dsns, sqlexec.DefaultSettleInterval+settleSlack)
		if rows := countRows(t, dsns); fmt.Sprint(rows) != "[5 5 0]" {
			t.Errorf("rows per shard %v, want [5 5 0]", rows)
		}
	})
}
