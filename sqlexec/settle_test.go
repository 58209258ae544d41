package sqlexec_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// settleSlack is what a settled transaction may take beyond the settler's interval
// (plus the time its data source was out of reach): a commit's own tries on fresh
// connections (half a second) and one pass on a loaded two-core machine.
const settleSlack = 2 * time.Second

// bank makes table kv (k int, v int) on every data source with n accounts of 100.
func bank(t *testing.T, db *sqlexec.DB, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for k := range n {
		if _, err := db.Exec(ctx, "INSERT INTO kv VALUES ($1, 100)", text(strconv.Itoa(k)), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// errBeforeCommit marks a transfer that failed before its commit began.
var errBeforeCommit = errors.New("failed before the commit")

// transfer moves 1 from account from to account to in one transaction, and returns
// the commit's error; a statement failing before the commit is errBeforeCommit.
func transfer(ctx context.Context, db *sqlexec.DB, from, to int) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%w: %v", errBeforeCommit, err)
	}
	for _, q := range []struct {
		sql string
		k   int
	}{{"UPDATE kv SET v = v - 1 WHERE k = $1", from}, {"UPDATE kv SET v = v + 1 WHERE k = $1", to}} {
		if _, err := tx.Exec(ctx, q.sql, text(strconv.Itoa(q.k)), nil); err != nil {
			tx.Rollback(ctx)
			return fmt.Errorf("%w: %v", errBeforeCommit, err)
		}
	}
	return tx.Commit(ctx)
}

// balances reads every account straight from the data sources (k mod len(dsns)).
func balances(t *testing.T, dsns []string, n int) []int {
	t.Helper()
	ctx := context.Background()
	out := make([]int, n)
	for i, d := range dsns {
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := c.Query(ctx, "SELECT k, v FROM kv")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k, v int
			rows.Scan(&k, &v)
			if k%len(dsns) != i {
				t.Errorf("account %d on data source %d", k, i)
			}
			out[k] = v
		}
		rows.Close()
		c.Close(ctx)
	}
	return out
}

// preparedNow counts the prepared transactions of each database, -1 for one that
// cannot be reached.
func preparedNow(dsns []string) []int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := make([]int, len(dsns))
	for i, d := range dsns {
		out[i] = -1
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			continue
		}
		c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").Scan(&out[i])
		c.Close(ctx)
	}
	return out
}

func total(counts []int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// waitSettled polls pg_prepared_xacts until no database holds a prepared transaction,
// and fails the test unless that happens within limit; it returns how long it took.
func waitSettled(t *testing.T, dsns []string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		p := preparedNow(dsns)
		if total(p) == 0 && !containsNeg(p) {
			break
		}
		if time.Since(start) > limit+10*time.Second {
			t.Fatalf("prepared transactions %v still there after %v (limit %v)", p, time.Since(start), limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	if took > limit {
		t.Errorf("settled after %v, more than %v", took, limit)
	}
	return took
}

func containsNeg(p []int) bool {
	for _, v := range p {
		if v < 0 {
			return true
		}
	}
	return false
}

// preparedWatch polls pg_prepared_xacts of every database in the background and keeps
// the greatest age of a prepared transaction it saw: nothing may stay prepared longer
// than the settler's interval plus the time its data source was out of reach.
type preparedWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   struct {
		sync.Mutex
		oldest time.Duration
		gid    string
	}
}

func watchPrepared(dsns []string) *preparedWatch {
	w := &preparedWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		conns := make([]*pgx.Conn, len(dsns))
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Close(context.Background())
				}
			}
		}()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for i, d := range dsns {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if conns[i] == nil || conns[i].IsClosed() {
					conns[i], _ = pgx.Connect(ctx, d)
				}
				if conns[i] != nil {
					rows, err := conns[i].Query(ctx, "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts WHERE database = current_database()")
					if err == nil {
						for rows.Next() {
							var gid string
							var secs float64
							rows.Scan(&gid, &secs)
							age := time.Duration(secs * float64(time.Second))
							w.mu.Lock()
							if age > w.mu.oldest {
								w.mu.oldest, w.mu.gid = age, gid
							}
							w.mu.Unlock()
						}
						rows.Close()
					} else {
						conns[i].Close(ctx)
						conns[i] = nil
					}
				}
				cancel()
			}
		}
	}()
	return w
}

// Stop ends the watch and returns the oldest prepared transaction it saw.
func (w *preparedWatch) Stop() (time.Duration, string) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.oldest, w.mu.gid
}

// terminate ends every other backend of the database dsn names, as
// pg_terminate_backend does to a shard in trouble, and returns how many.
func terminate(t *testing.T, dsn string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// transferRetrying retries a transfer that failed before its commit (a pooled
// connection whose backend was terminated) and returns the commit's error. A transfer
// that waits 10 s fails the test: a prepared transaction left behind holds the rows.
func transferRetrying(t *testing.T, db *sqlexec.DB, dsns []string, from, to int) error {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := transfer(ctx, db, from, to)
		blocked := ctx.Err() != nil
		cancel()
		if blocked {
			t.Fatalf("transfer %d -> %d waited 10 s for its rows (prepared %v): %v", from, to, preparedNow(dsns), err)
		}
		if !errors.Is(err, errBeforeCommit) {
			return err
		}
		if attempt == 20 {
			t.Fatalf("transfer %d -> %d: %v", from, to, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSettleAfterTerminatedBackends terminates the backends of one data source between
// the phases of two-phase commits, while the coordinator keeps running (the coordinator
// part's data source, and a participant's, before and after the decision). Every
// commit must still succeed, nothing may stay prepared longer than the settler's
// interval, and every transfer must be applied exactly once.
func TestSettleAfterTerminatedBackends(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("term_%d", i)))
	}
	db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const accounts = 6
	bank(t, db, accounts)
	// Which data source's backends to terminate at which stage, commit by commit:
	// five times a participant (data source 1), as in the bank-transfer run that
	// found the problem, then the coordinator's data source and a participant after
	// the decision.
	plan := []struct {
		stage string
		ds    int
	}{
		{sqlexec.StagePrepared, 1}, {sqlexec.StagePrepared, 1}, {sqlexec.StageCommitted, 1}, {sqlexec.StagePrepared, 1}, {sqlexec.StageCommitted, 1},
		{sqlexec.StagePrepared, 0}, {sqlexec.StageCommitted, 2}, {sqlexec.StagePrepared, 0},
	}
	// The hook runs inside Commit, in this goroutine; armed lets it act once per
	// commit.
	step, armed, terminated := 0, false, 0
	db.Committer().SetPhaseHook(func(stage string) {
		if armed && plan[step].stage == stage {
			terminated += terminate(t, dsns[plan[step].ds])
			armed = false
		}
	})
	watch := watchPrepared(dsns)
	want := []int{100, 100, 100, 100, 100, 100}
	for i := range len(plan) {
		// Accounts 3 -> 1 span data sources 0 and 1; 4 -> 2 span 1 and 2; every
		// transaction is two-phase over two data sources, and the plan's data source
		// is in it.
		from, to := 3, 1
		if plan[i].ds == 2 {
			from, to = 4, 2
		}
		step, armed = i, true
		if err := transferRetrying(t, db, dsns, from, to); err != nil {
			t.Errorf("transfer %d (terminating data source %d at %s): commit: %v", i, plan[i].ds, plan[i].stage, err)
		} else {
			want[from]--
			want[to]++
		}
	}
	took := waitSettled(t, dsns, sqlexec.DefaultSettleInterval+settleSlack)
	oldest, gid := watch.Stop()
	t.Logf("%d backends terminated; settled %v after the last commit; oldest prepared transaction seen: %v (%s)", terminated, took, oldest, gid)
	if oldest > sqlexec.DefaultSettleInterval+settleSlack {
		t.Errorf("a transaction stayed prepared for %v (%s)", oldest, gid)
	}
	if got := balances(t, dsns, accounts); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("balances %v, want %v", got, want)
	}
	if st := db.Settler().Stats(); st.Retried == 0 || st.InDoubt != 0 {
		t.Errorf("settler stats %+v: want parts finished on fresh connections, none in doubt", st)
	}
}

// TestSettleAfterShardOutage stops the cluster of one data source in the middle of a
// two-phase commit, keeps it down for a while, and starts it again, with the
// coordinator running throughout: within the settler's interval of the restart,
// nothing is prepared any more and the transaction is applied everywhere or nowhere.
func TestSettleAfterShardOutage(t *testing.T) {
	up := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	down := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	const outage = 2 * time.Second
	for _, tc := range []struct {
		name string
		// stage at which the cluster of data source downDS stops
		stage  string
		downDS int
		// whether the transfer ends applied
		applied bool
	}{
		// A participant stops after the decision: the commit succeeds, its part
		// commits when it is back.
		{"participant after the decision", sqlexec.StageCommitted, 2, true},
		// The coordinator part's data source stops before the decision: the outcome
		// is unknown to the client (08007), the participants' parts cannot be
		// decided until it is back, and then everything rolls back.
		{"coordinator before the decision", sqlexec.StagePrepared, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var dsns []string
			for i := range 3 {
				cl := up
				if i == tc.downDS {
					cl = down
				}
				dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("outage_%d", i)))
			}
			db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			bank(t, db, 3)
			stopped := false
			db.Committer().SetPhaseHook(func(stage string) {
				if stage == tc.stage && !stopped {
					down.Stop() // the hook runs in this goroutine, inside Commit
					stopped = true
				}
			})
			// Accounts 0 -> 2: the coordinator part on data source 0, a participant
			// on data source 2.
			err = transfer(ctx, db, 0, 2)
			downAt := time.Now()
			if !stopped {
				t.Fatalf("the commit did not reach %s: %v", tc.stage, err)
			}
			if tc.applied && err != nil {
				t.Errorf("commit: %v, want success (the decision was made)", err)
			}
			var se *sqlexec.ShardError
			if !tc.applied && (!errors.As(err, &se) || se.SQLState() != "08007") {
				t.Errorf("commit: %v, want 08007 (outcome unknown)", err)
			}
			if st := db.Settler().Stats(); st.InDoubt != 1 {
				t.Errorf("in doubt right after the commit: %d, want 1", st.InDoubt)
			}
			watch := watchPrepared(dsns)
			time.Sleep(outage)
			if st := db.Settler().Stats(); st.InDoubt != 1 || st.Unreachable != 1 || st.OldestInDoubt < outage {
				t.Errorf("during the outage: %+v, want 1 in doubt for %v or more, 1 data source unreachable", st, outage)
			}
			down.Start()
			unreachable := time.Since(downAt)
			took := waitSettled(t, dsns, sqlexec.DefaultSettleInterval+settleSlack)
			oldest, gid := watch.Stop()
			t.Logf("down for %v; settled %v after the restart; oldest prepared transaction seen: %v (%s)", unreachable, took, oldest, gid)
			if oldest > unreachable+sqlexec.DefaultSettleInterval+settleSlack {
				t.Errorf("a transaction stayed prepared for %v (%s), longer than the outage (%v) and the interval", oldest, gid, unreachable)
			}
			want := "[99 100 101]"
			if !tc.applied {
				want = "[100 100 100]"
			}
			if got := balances(t, dsns, 3); fmt.Sprint(got) != want {
				t.Errorf("balances %v, want %s", got, want)
			}
			deadline := time.Now().Add(sqlexec.DefaultSettleInterval + settleSlack)
			for db.Settler().Stats().InDoubt != 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if st := db.Settler().Stats(); st.InDoubt != 0 || st.Unreachable != 0 {
				t.Errorf("after the restart: %+v, want nothing in doubt, every data source reached", st)
			}
		})
	}
}

// killChild starts the test binary as a child that commits over dsns through the SQL
// core and pauses at stage, then kills it with SIGKILL there.
func killChild(t testing.TB, stage string, dsns []string) {
	t.Helper()
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
			t.Fatal("the child ended before reaching the stage")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the child did not reach the stage")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
}

// TestSettleAfterCoordinatorKill kills a coordinator (another process, SIGKILL) between
// PREPARE and COMMIT PREPARED while a second coordinator over the same data sources
// keeps running: the survivor's settler finishes the dead one's transaction within
// its interval, without a restart.
func TestSettleAfterCoordinatorKill(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	for _, stage := range []string{sqlexec.StagePrepared, sqlexec.StageCommitted} {
		t.Run(stage, func(t *testing.T) {
			ctx := context.Background()
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("killed_%s_%d", stage, i)))
			}
			db, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
			watch := watchPrepared(dsns)
			killChild(t, stage, dsns)
			killed := time.Now()
			took := waitSettled(t, dsns, sqlexec.DefaultSettleInterval+settleSlack)
			oldest, gid := watch.Stop()
			t.Logf("settled %v after the kill; oldest prepared transaction seen: %v (%s)", took, oldest, gid)
			rows, _ := countOn(t, dsns)
			want := "[1 1 1]"
			if stage == sqlexec.StagePrepared {
				want = "[0 0 0]"
			}
			if fmt.Sprint(rows) != want {
				t.Errorf("rows per data source %v, want %s", rows, want)
			}
			st := db.Settler().Stats()
			if stage == sqlexec.StagePrepared && st.RolledBack != 3 || stage == sqlexec.StageCommitted && st.Committed != 2 {
				t.Errorf("settler stats %+v after %v", st, time.Since(killed))
			}
		})
	}
}

// TestSettleLeavesLiveCoordinator pauses a coordinator between PREPARE and COMMIT
// PREPARED and opens a second one over the same data sources: neither the second's
// first pass nor its loop, nor the first's own loop, may touch the transaction, even
// after the first lost its lock connection to one data source; the first then
// commits it.
func TestSettleLeavesLiveCoordinator(t *testing.T) {
	cl := pgtest.StartClusterWith(t, "max_prepared_transactions = 20")
	ctx := context.Background()
	var dsns []string
	for i := range 3 {
		dsns = append(dsns, cl.NewDatabase(fmt.Sprintf("live_%d", i)))
	}
	const interval = 100 * time.Millisecond
	first, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := first.SimpleExec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first.Committer().SetPhaseHook(func(stage string) {
		if stage == sqlexec.StagePrepared {
			once.Do(func() {
				close(paused)
				<-resume
			})
		}
	})
	committed := make(chan error, 1)
	go func() {
		tx, _ := first.Begin(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES (0, 'a'), (1, 'b'), (2, 'c')", sqlplan.Args{}, nil); err != nil {
			tx.Rollback(ctx)
			committed <- err
			return
		}
		committed <- tx.Commit(ctx)
	}()
	select {
	case <-paused:
	case err := <-committed:
		t.Fatalf("the commit ended before it paused: %v", err)
	}
	defer func() {
		select {
		case <-resume:
		default:
			close(resume)
		}
	}()
	second, err := sqlexec.Open(ctx, kvRules(t, dsns), sqlexec.Config{TwoPhase: true, SettleInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	// waitPasses waits until both settlers have made n more passes.
	waitPasses := func(n int64) {
		t.Helper()
		a, b := first.Settler().Stats().Passes, second.Settler().Stats().Passes
		deadline := time.Now().Add(30 * time.Second)
		for first.Settler().Stats().Passes < a+n || second.Settler().Stats().Passes < b+n {
			if time.Now().After(deadline) {
				t.Fatal("the settlers stopped passing")
			}
			time.Sleep(interval / 2)
		}
	}
	waitPasses(5)
	if _, p := countOn(t, dsns); fmt.Sprint(p) != "[1 1 1]" {
		t.Fatalf("prepared parts %v while their coordinator is paused, want [1 1 1]", p)
	}
	if st := second.Settler().Stats(); st.InDoubt != 1 || st.Committed+st.RolledBack != 0 {
		t.Errorf("the second settler: %+v, want the other's transaction counted in doubt, nothing finished", st)
	}
	// The first coordinator loses its lock connection to data source 1 (its backend
	// is terminated); it still holds its lock on the others, so it is alive.
	c, err := pgx.Connect(ctx, dsns[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 "+
		"AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
		sqlexec.InstanceLockClass, first.Committer().Instance()).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate the first coordinator's lock connection: %d, %v", n, err)
	}
	waitPasses(5)
	if _, p := countOn(t, dsns); fmt.Sprint(p) != "[1 1 1]" {
		t.Fatalf("prepared parts %v after the coordinator lost one lock connection, want [1 1 1]", p)
	}
	close(resume)
	if err := <-committed; err != nil {
		t.Fatalf("the paused commit: %v", err)
	}
	rows, p := countOn(t, dsns)
	if fmt.Sprint(rows) != "[1 1 1]" || fmt.Sprint(p) != "[0 0 0]" {
		t.Errorf("after the commit: rows %v, prepared %v", rows, p)
	}
	// The first coordinator's settler takes its lock on data source 1 again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted "+
			"AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
			sqlexec.InstanceLockClass, first.Committer().Instance()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first coordinator did not take its lock on data source 1 again")
		}
		time.Sleep(interval)
	}
}
