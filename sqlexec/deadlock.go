package sqlexec

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// A deadlock between two transactions that span data sources is invisible to each
// PostgreSQL server: data source 0 sees T1 wait for T2, data source 1 sees T2 wait for
// T1, and neither sees a cycle. Without help both wait forever. DeadlockDetector finds
// such cycles as Citus does: it asks every data source which backends wait for which
// (pg_blocking_pids), maps backends to the sessions that hold them, looks for a cycle
// among the sessions, and cancels the youngest transaction of a cycle. That session's
// statement fails with SQLSTATE 40P01, deadlock_detected, which clients retry (sysbench
// and pgbench do).

// DefaultDeadlockInterval is how often the detector looks for cycles, while sessions
// with transactions over several data sources exist.
const DefaultDeadlockInterval = time.Second

// DeadlockDetector watches the transactions of its sessions for cross-shard deadlocks.
// Start it, and make sessions with NewSession then SetDeadlockDetector.
type DeadlockDetector struct {
	rules    *rules.Compiled
	pool     Pool
	interval time.Duration

	mu struct {
		sync.Mutex
		sessions map[*Session]bool
	}
	victims  atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// NewDeadlockDetector returns a detector that reads the data sources through pool
// (connections of its own, outside any session) every interval (0: the default).
func NewDeadlockDetector(r *rules.Compiled, pool Pool, interval time.Duration) *DeadlockDetector {
	if interval <= 0 {
		interval = DefaultDeadlockInterval
	}
	d := &DeadlockDetector{rules: r, pool: pool, interval: interval, stop: make(chan struct{}), done: make(chan struct{})}
	d.mu.sessions = map[*Session]bool{}
	return d
}

// Start runs the detector until Close.
func (d *DeadlockDetector) Start() {
	go func() {
		defer close(d.done)
		t := time.NewTicker(d.interval)
		defer t.Stop()
		for {
			select {
			case <-d.stop:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), d.interval*4)
				d.Check(ctx)
				cancel()
			}
		}
	}()
}

// Close stops the detector and waits for it.
func (d *DeadlockDetector) Close() {
	d.stopOnce.Do(func() {
		close(d.stop)
	})
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
	}
}

// Victims returns how many transactions the detector has ended.
func (d *DeadlockDetector) Victims() int64 { return d.victims.Load() }

func (d *DeadlockDetector) watch(s *Session) {
	d.mu.Lock()
	d.mu.sessions[s] = true
	d.mu.Unlock()
}

func (d *DeadlockDetector) forget(s *Session) {
	d.mu.Lock()
	delete(d.mu.sessions, s)
	d.mu.Unlock()
}

// Check looks for cycles once and cancels one victim per cycle found; it returns the
// number of victims.
//
// The data sources are asked one after the other, and meanwhile a transaction can end
// and its server connection serve another client, so one pass may see a cycle that
// never was (a phantom deadlock). A real deadlock stays until it is broken, so a cycle
// is acted on only when a second pass finds it again, between the same transactions.
func (d *DeadlockDetector) Check(ctx context.Context) int {
	first := d.waitGraph(ctx)
	if first == nil || len(cycles(first.waits)) == 0 {
		return 0
	}
	second := d.waitGraph(ctx)
	if second == nil {
		return 0
	}
	victims := 0
	for _, cycle := range cycles(second.waits) {
		if !first.saw(second, cycle) {
			continue
		}
		// The youngest transaction of the cycle gives way, as Citus does.
		victim := slices.MaxFunc(cycle, func(a, b *Session) int { return second.started[a].Compare(second.started[b]) })
		k := second.waiting[victim]
		victim.markDeadlocked(cycle)
		err := withConn(ctx, d.pool, k.ds, func(conn *pgconn.PgConn) error {
			return conn.Exec(ctx, "SELECT pg_cancel_backend("+strconv.Itoa(k.pid)+")").Close()
		})
		if err == nil {
			victims++
			d.victims.Add(1)
		}
	}
	return victims
}

// backendKey is a backend process of a data source.
type backendKey struct{ ds, pid int }

// waitGraph is one pass over the data sources: which open transaction waits for which.
type waitGraph struct {
	waits   map[*Session]map[*Session]bool
	waiting map[*Session]backendKey // a waiting backend of each waiting session
	started map[*Session]time.Time
	txn     map[*Session]uint64 // the transaction each session had
}

// saw reports whether g, an earlier pass, saw cycle (of later) too: the same
// transactions, each waiting for the next.
func (g *waitGraph) saw(later *waitGraph, cycle []*Session) bool {
	for i, s := range cycle {
		next := cycle[(i+1)%len(cycle)]
		if t, ok := g.txn[s]; !ok || t != later.txn[s] || !g.waits[s][next] {
			return false
		}
	}
	return true
}

// waitGraph asks every data source of the open transactions who waits for whom; nil
// when there is nothing to look for or a data source cannot be asked.
func (d *DeadlockDetector) waitGraph(ctx context.Context) *waitGraph {
	// Sessions by (data source, backend pid), for every open transaction: a cycle
	// across data sources needs one transaction on two or more, but may pass through
	// others on one (T1 on ds_0 waits for T2, T2 waits on ds_1 for T3, T3 waits on
	// ds_0 for T1).
	g := &waitGraph{waits: map[*Session]map[*Session]bool{}, waiting: map[*Session]backendKey{},
		started: map[*Session]time.Time{}, txn: map[*Session]uint64{}}
	owner := map[backendKey]*Session{}
	dss := map[int]bool{}
	spanning := false
	d.mu.Lock()
	for s := range d.mu.sessions {
		pids, begun, txn := s.backends()
		if len(pids) == 0 {
			continue
		}
		spanning = spanning || len(pids) > 1
		g.started[s], g.txn[s] = begun, txn
		for ds, pid := range pids {
			owner[backendKey{ds, pid}] = s
			dss[ds] = true
		}
	}
	d.mu.Unlock()
	if !spanning || len(g.started) < 2 {
		return nil // a cycle on one data source is its server's to break
	}
	// Who waits for whom, on every data source those transactions touch.
	for ds := range dss {
		err := withConn(ctx, d.pool, ds, func(conn *pgconn.PgConn) error {
			res, err := conn.Exec(ctx, `SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).ReadAll()
			if err != nil {
				return err
			}
			for _, row := range res[0].Rows {
				pid, _ := strconv.Atoi(string(row[0]))
				waiter := owner[backendKey{ds, pid}]
				if waiter == nil {
					continue
				}
				for _, b := range strings.Split(strings.Trim(string(row[1]), "{}"), ",") {
					bp, err := strconv.Atoi(b)
					if err != nil {
						continue
					}
					if holder := owner[backendKey{ds, bp}]; holder != nil && holder != waiter {
						if g.waits[waiter] == nil {
							g.waits[waiter] = map[*Session]bool{}
						}
						g.waits[waiter][holder] = true
						g.waiting[waiter] = backendKey{ds, pid}
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil // a data source that cannot be asked: try again next time
		}
	}
	return g
}

// cycles returns the cycles of a wait-for graph, each once (as the sessions on it).
func cycles(waits map[*Session]map[*Session]bool) [][]*Session {
	var out [][]*Session
	done := map[*Session]bool{}
	for start := range waits {
		if done[start] {
			continue
		}
		// Follow the graph depth first, keeping the path; a session met again on the
		// path closes a cycle.
		var path []*Session
		onPath := map[*Session]int{}
		var visit func(s *Session) bool
		visit = func(s *Session) bool {
			if i, ok := onPath[s]; ok {
				out = append(out, slices.Clone(path[i:]))
				return true
			}
			if done[s] {
				return false
			}
			onPath[s] = len(path)
			path = append(path, s)
			for next := range waits[s] {
				if visit(next) {
					return true
				}
			}
			path = path[:len(path)-1]
			delete(onPath, s)
			done[s] = true
			return false
		}
		visit(start)
		for _, s := range path {
			done[s] = true
		}
	}
	return out
}

// deadlockError is what a victim's statement fails with.
func deadlockError(names []string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: "40P01",
		Message: "deadlock detected",
		Detail:  fmt.Sprintf("this transaction waited for another across data sources %s, which waited for it; shardlab ended this one", strings.Join(names, ", ")),
		Hint:    "Retry the transaction."}
}
