package shardsql_test

import (
	"bufio"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
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
	db, err := shardsql.Open(shardsql.Config{Rules: c, TwoPhase: true, PhaseHook: func(s string) {
		if s == stage {
			fmt.Printf("STAGE %s\n", s)
			os.Stdout.Sync()
			time.Sleep(time.Hour) // SIGKILL comes first
		}
	}})
	if err != nil {
		log.Fatal(err)
	}
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
				t.Fatal("the child did not reach the stage")
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
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
