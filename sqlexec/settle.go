package sqlexec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"
)

// A two-phase transaction is in doubt from its first PREPARE TRANSACTION until every
// part is committed or rolled back. A prepared part keeps its row locks, so until it
// is settled, transactions on those rows wait and half of a committed transaction is
// invisible. Its committer settles what it can at once (see Committer.finish); what is
// left (a data source was down, the committer was killed) is settled by a Settler, as
// Citus's maintenance daemon recovers its prepared transactions: in one pass at start,
// before clients are served, and then every Interval while the coordinator runs.
//
// Several coordinators may work over the same data sources (two proxies, a proxy and
// a program using the driver). A settler must never finish a transaction that a live
// coordinator is still committing: it would roll back what the coordinator is about to
// commit. A coordinator shows it is alive by what it holds: its settler keeps, on each
// data source, a connection holding the session advisory lock (InstanceLockClass,
// instance id), and every GID it makes carries that instance id. A coordinator that
// dies holds nothing, since its connections end with it, and the others settle its
// transactions. A settler leaves alone the transactions of the instances whose lock it
// sees held on any data source it reaches, and those its own committer is preparing or
// committing right now. Data sources that are schemas of one database share one lock,
// which the settler's first connection there holds for the others.
//
// Another coordinator's rules may name the data sources in another order, or only
// some of them, so the data source numbers in its GIDs are its own. A settler
// therefore rolls back another coordinator's transaction only by rolling back its
// coordinator part (found by the part's GID, wherever it is listed), commits one only
// on a decision row it found, deletes only its own committer's decision rows, and
// otherwise leaves the transaction in doubt. So does it with a legacy GID, whose
// coordinator (an older version, holding no lock) may be alive: without a decision
// row, an operator settles it.
//
// Should a coordinator lose every lock connection at once while it commits (the
// backends terminated on every data source), another settler may take it for dead.
// Atomicity still holds: without a decision row, a settler first rolls back the
// coordinator part, which is what decides; the coordinator's COMMIT PREPARED then
// finds nothing to commit and reports the rollback.

// DefaultSettleInterval is how often a settler looks for transactions in doubt.
// Clients wait on a prepared part's locks, so it is short: Citus's 60 s would block
// them for a minute.
const DefaultSettleInterval = time.Second

// DefaultSettleConnectTimeout bounds dialling a data source for the settler and for a
// commit's retries on fresh connections.
const DefaultSettleConnectTimeout = 5 * time.Second

// settleStepTimeout bounds one round trip of a pass on one data source: a server that
// hangs holds up the pass no longer than that.
const settleStepTimeout = 5 * time.Second

// InstanceLockClass is the first key of the advisory lock (pg_advisory_lock(int4,
// int4)) a settler holds for its coordinator; the second is the instance id. It spells
// "s2pc" in ASCII.
const InstanceLockClass int32 = 0x73327063

// ErrSettlerClosed is returned by a pass asked for after the settler's Close.
var ErrSettlerClosed = errors.New("sqlexec: the settler is closed")

// SettlerConfig tunes a Settler. The zero value is usable.
type SettlerConfig struct {
	// Interval between passes (0: DefaultSettleInterval; negative: no pass after
	// Start's).
	Interval time.Duration
	// ConnectTimeout bounds dialling a data source (0: DefaultSettleConnectTimeout).
	ConnectTimeout time.Duration
	// Dial, when set, opens the TCP connections of the settler and of the committer's
	// tries on fresh connections (pgconn's dialer when nil): the wire proxy gives them
	// its server connections' keepalive and user timeout, so that a data source the
	// network cut off fails them in bounded time as it fails the pools'.
	Dial pgconn.DialFunc
	// Logger receives what the settler settles and which data sources it cannot
	// reach; nil discards it.
	Logger *slog.Logger
}

// Settler settles the transactions a two-phase Committer leaves in doubt, and those of
// coordinators that died, while its committer runs. It keeps a connection of its own to
// every data source (outside any pool), which holds the instance lock. Make it with
// NewSettler, run Start before serving clients, and Close it at the end.
type Settler struct {
	c              *Committer
	interval       time.Duration
	connectTimeout time.Duration
	dialFunc       pgconn.DialFunc
	log            *slog.Logger

	// pass serializes passes and guards conns, locked and closed.
	pass   sync.Mutex
	conns  []*pgconn.PgConn // per data source; nil until dialled
	locked []bool           // whether conns[ds] holds the instance lock
	closed bool             // Close ran: no pass dials again
	shared []bool           // whether locked[ds] is the lock of another of conns, to the same database

	// holders are the backends (process id and client port) of the connections
	// holding the instance lock, per data source: data sources that are schemas of
	// one database share one lock, held by the first of their connections. Passes
	// dial data sources concurrently, hence the mutex.
	holders struct {
		sync.Mutex
		of []lockHolder
	}

	mu struct {
		sync.Mutex
		doubt       map[string]doubtEntry
		unreachable []bool // per data source, as of the last pass
		lastPass    time.Time
		cancel      context.CancelFunc // ends the loop
	}
	committed, rolledBack atomic.Int64
	passes, failedPasses  atomic.Int64

	loop      sync.WaitGroup
	closeOnce sync.Once
}

// lockHolder is a backend holding the instance lock: its process id and the client
// port of its connection (-1 over a Unix socket). The pair tells the settler's own
// backends from those of another coordinator that drew the same instance id.
type lockHolder struct{ pid, port int }

// doubtEntry is a transaction known to be in doubt: since its first part was prepared
// (as old as the oldest part the settler saw), and when this settler learnt of it.
type doubtEntry struct {
	since, noted time.Time
}

// NewSettler returns a settler for c, which must be two-phase. It connects to nothing
// until Start.
func NewSettler(c *Committer, cfg SettlerConfig) (*Settler, error) {
	if !c.twoPhase {
		return nil, errors.New("sqlexec: a settler needs a two-phase committer")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultSettleInterval
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultSettleConnectTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := c.rules.NumDataSources()
	for _, ds := range c.rules.DataSources() {
		if _, err := pgconn.ParseConfig(ds.DSN); err != nil {
			return nil, fmt.Errorf("sqlexec: data source %s: %w", ds.Name, err)
		}
	}
	s := &Settler{c: c, interval: cfg.Interval, connectTimeout: cfg.ConnectTimeout, dialFunc: cfg.Dial, log: log,
		conns: make([]*pgconn.PgConn, n), locked: make([]bool, n), shared: make([]bool, n)}
	s.holders.of = make([]lockHolder, n)
	s.mu.doubt = map[string]doubtEntry{}
	s.mu.unreachable = make([]bool, n)
	return s, nil
}

// Start runs a first pass, which needs every data source: it creates the decision
// table where it is missing, takes the instance lock and settles what coordinators
// that died left in doubt. Then, unless the interval is negative, it runs a pass every
// interval until Close. Cancelling ctx abandons the first pass. The committer must not
// commit before Start returns.
func (s *Settler) Start(ctx context.Context) error {
	if !s.c.settler.CompareAndSwap(nil, s) {
		return errors.New("sqlexec: the committer already has a settler")
	}
	for attempt := 1; ; attempt++ {
		_, err := s.Settle(ctx)
		if err != nil {
			s.closeConns()
			s.c.settler.CompareAndSwap(s, nil)
			return err
		}
		s.pass.Lock()
		locked := !slices.Contains(s.locked, false)
		s.pass.Unlock()
		if locked {
			break
		}
		// Another live coordinator drew the same instance id (one chance in four
		// billion): draw another before any transaction carries it.
		s.closeConns()
		if attempt == 3 {
			s.c.settler.CompareAndSwap(s, nil)
			return errors.New("sqlexec: settler: the instance lock is held by another session")
		}
		s.c.newInstance()
	}
	if s.interval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.mu.Lock()
		s.mu.cancel = cancel
		s.mu.Unlock()
		s.loop.Go(func() { s.run(ctx) })
	}
	return nil
}

// run passes every interval until ctx ends (Close cancels it, a pass under way too).
func (s *Settler) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.Settle(ctx)
	}
}

// Close stops the loop, waits for a pass under way and closes the settler's
// connections, which releases the instance lock. It is idempotent; a pass asked for
// afterwards fails with ErrSettlerClosed.
func (s *Settler) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		if s.mu.cancel != nil {
			s.mu.cancel()
		}
		s.mu.Unlock()
		s.loop.Wait()
		s.pass.Lock()
		s.closed = true
		s.pass.Unlock()
		s.closeConns()
		s.c.settler.CompareAndSwap(s, nil)
	})
	return nil
}

func (s *Settler) closeConns() {
	s.pass.Lock()
	defer s.pass.Unlock()
	for ds, conn := range s.conns {
		if conn != nil {
			closeConn(conn)
		}
		s.drop(ds)
	}
}

// drop forgets the connection to ds (closed by the caller) and the lock it held.
func (s *Settler) drop(ds int) {
	s.conns[ds], s.locked[ds], s.shared[ds] = nil, false, false
	s.holders.Lock()
	s.holders.of[ds] = lockHolder{}
	s.holders.Unlock()
}

// SettleStats is a snapshot of a coordinator's two-phase commits in doubt.
type SettleStats struct {
	// InDoubt counts the transactions found prepared and left unsettled by the last
	// pass (those another live coordinator is committing at that moment included, this
	// coordinator's own under way not), and those this coordinator's commits left
	// prepared since.
	InDoubt int
	// OldestInDoubt is the age of the oldest of them, from its first PREPARE.
	OldestInDoubt time.Duration
	// Committed and RolledBack count the prepared parts the settler finished.
	Committed, RolledBack int64
	// Retried counts the parts a commit finished on a fresh connection after the
	// transaction's own connection failed.
	Retried int64
	// Passes counts passes; FailedPasses those that could not reach a data source or
	// finish a part.
	Passes, FailedPasses int64
	// Unreachable counts the data sources the last pass could not reach.
	Unreachable int
	// LastPass is when the last pass began (zero before the first).
	LastPass time.Time
	// Interval is the time between passes.
	Interval time.Duration
}

// Stats returns the settler's counters.
func (s *Settler) Stats() SettleStats {
	st := SettleStats{Committed: s.committed.Load(), RolledBack: s.rolledBack.Load(), Retried: s.c.retried.Load(),
		Passes: s.passes.Load(), FailedPasses: s.failedPasses.Load(), Interval: s.interval}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.InDoubt, st.LastPass = len(s.mu.doubt), s.mu.lastPass
	now := time.Now()
	for _, e := range s.mu.doubt {
		st.OldestInDoubt = max(st.OldestInDoubt, now.Sub(e.since))
	}
	for _, u := range s.mu.unreachable {
		if u {
			st.Unreachable++
		}
	}
	return st
}

func (s *Settler) noteInDoubt(gid string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.mu.doubt[gid]
	if !ok || since.Before(e.since) {
		e.since = since
	}
	e.noted = time.Now()
	s.mu.doubt[gid] = e
}

// SettleResult is what one pass did.
type SettleResult struct {
	// Committed and RolledBack count the prepared parts it finished.
	Committed, RolledBack int
	// Left counts the transactions it found prepared and left: another live
	// coordinator's, or one it could not decide or finish.
	Left int
}

// gidInfo is what a part's GID says.
type gidInfo struct {
	gid         string // the transaction's id, the decision row's key
	instance    uint32
	legacy      bool // made before GIDs carried an instance id
	coordinator int  // -1 when unknown (legacy)
	ds          int
}

// parseGID reads a part's GID; ok is false for one shardlab did not make.
func parseGID(part string) (g gidInfo, ok bool) {
	rest, found := strings.CutPrefix(part, GIDPrefix)
	if !found {
		return g, false
	}
	f := strings.Split(rest, "_")
	hexOK := func(s string, n int) bool {
		_, err := strconv.ParseUint(s, 16, 64)
		return len(s) == n && err == nil && strings.ToLower(s) == s
	}
	num := func(s string) (int, bool) {
		v, err := strconv.Atoi(s)
		return v, err == nil && v >= 0 && strconv.Itoa(v) == s
	}
	var dsOK, coordOK bool
	switch len(f) {
	case 4:
		if !hexOK(f[0], 8) || !hexOK(f[1], 16) {
			return g, false
		}
		inst, _ := strconv.ParseUint(f[0], 16, 32)
		g.instance = uint32(inst)
		g.coordinator, coordOK = num(f[2])
		g.ds, dsOK = num(f[3])
	case 2:
		if !hexOK(f[0], 16) {
			return g, false
		}
		g.legacy, g.coordinator, coordOK = true, -1, true
		g.ds, dsOK = num(f[1])
	default:
		return g, false
	}
	if !dsOK || !coordOK {
		return g, false
	}
	g.gid = part[:strings.LastIndexByte(part, '_')]
	return g, true
}

// preparedPart is a prepared transaction a pass found.
type preparedPart struct {
	name   string // its GID
	on     int    // the data source whose connection listed it (any connection to its database can finish it)
	age    time.Duration
	gidInf gidInfo
}

// Settle runs one pass: on every data source it reaches (dialling where needed, taking
// the instance lock) it reads the decision rows, lists shardlab's prepared
// transactions and sees which coordinators are alive; then it commits every part of
// a transaction whose decision row exists and rolls back the others, the coordinator
// part first, skipping those of live coordinators and those its committer has under
// way, and leaving those it cannot decide (see the package comment on other
// coordinators' rules); last, it deletes its own committer's decision rows no
// prepared part needs any more. It returns
// an error naming the data sources it could not reach and the parts it could not
// finish; the rest of the pass is done all the same. Cancelling ctx abandons the pass.
// After Close it does nothing and returns ErrSettlerClosed.
func (s *Settler) Settle(ctx context.Context) (SettleResult, error) {
	s.pass.Lock()
	defer s.pass.Unlock()
	if s.closed {
		return SettleResult{}, ErrSettlerClosed
	}
	var res SettleResult
	start := time.Now()
	n := len(s.conns)
	failed := make([]error, n) // per data source, why it was left out of this pass
	// Round 1: connect, take the lock, read the decisions. The decisions are read
	// before any data source lists its prepared parts, so that a decision row whose
	// transaction shows no prepared part below has every part finished (they were all
	// prepared before the decision committed).
	decisions := make([][]string, n)
	s.each(ctx, failed, func(ctx context.Context, ds int, conn *pgconn.PgConn) error {
		r, err := conn.Exec(ctx, "SELECT gid FROM "+DecisionTable).ReadAll()
		if err == nil {
			for _, row := range r[0].Rows {
				decisions[ds] = append(decisions[ds], string(row[0]))
			}
		}
		return err
	})
	decided := map[string]bool{}
	for _, gids := range decisions {
		for _, g := range gids {
			decided[g] = true
		}
	}
	listedAt := time.Now()
	// Round 2: the prepared parts.
	listed := make([][]preparedPart, n)
	s.each(ctx, failed, func(ctx context.Context, ds int, conn *pgconn.PgConn) error {
		r, err := conn.Exec(ctx, "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts "+
			"WHERE database = current_database() AND left(gid, "+strconv.Itoa(len(GIDPrefix))+") = '"+GIDPrefix+"'").ReadAll()
		if err != nil {
			return err
		}
		for _, row := range r[0].Rows {
			g, ok := parseGID(string(row[0]))
			if !ok {
				continue
			}
			secs, _ := strconv.ParseFloat(string(row[1]), 64)
			listed[ds] = append(listed[ds], preparedPart{name: string(row[0]), on: ds, age: time.Duration(secs * float64(time.Second)), gidInf: g})
		}
		return nil
	})
	// Round 3: the live coordinators, after the listing: a coordinator whose part
	// was listed took its lock before it prepared, so it shows here unless it died.
	live := make([][]uint32, n)
	s.each(ctx, failed, func(ctx context.Context, ds int, conn *pgconn.PgConn) error {
		r, err := conn.Exec(ctx, fmt.Sprintf("SELECT DISTINCT objid FROM pg_locks WHERE locktype = 'advisory' "+
			"AND classid = %d AND objsubid = 2 AND granted", InstanceLockClass)).ReadAll()
		if err != nil {
			return err
		}
		for _, row := range r[0].Rows {
			if v, err := strconv.ParseUint(string(row[0]), 10, 32); err == nil {
				live[ds] = append(live[ds], uint32(v))
			}
		}
		return nil
	})
	alive := map[uint32]bool{}
	for _, l := range live {
		for _, inst := range l {
			alive[inst] = true
		}
	}
	reachable := func(ds int) bool { return ds >= 0 && ds < n && failed[ds] == nil }
	all := !slices.ContainsFunc(failed, func(err error) bool { return err != nil })

	// Group the parts by transaction; data sources that are schemas of one database
	// list the same parts.
	byGID := map[string][]preparedPart{}
	seen := map[string]bool{}
	for ds := range n {
		if !reachable(ds) {
			continue
		}
		for _, p := range listed[ds] {
			if !seen[p.name] {
				seen[p.name] = true
				byGID[p.gidInf.gid] = append(byGID[p.gidInf.gid], p)
			}
		}
	}
	own := s.c.instance.Load()
	var errs []error
	left := map[string]time.Time{}
	settled := map[string]bool{}
	for _, gid := range slices.Sorted(maps.Keys(byGID)) {
		parts := byGID[gid]
		g := parts[0].gidInf
		oldest := slices.MaxFunc(parts, func(a, b preparedPart) int { return cmp.Compare(a.age, b.age) }).age
		switch {
		case !g.legacy && g.instance == own && s.c.busy(gid):
			continue // being committed right now, by this very coordinator
		case !g.legacy && g.instance != own && alive[g.instance]:
			left[gid] = listedAt.Add(-oldest)
			continue
		}
		c, r, err := s.settle(ctx, g, parts, decided[gid], reachable, g.instance == own && !g.legacy)
		res.Committed += c
		res.RolledBack += r
		if errors.Is(err, errUndecidable) {
			// Not a failure of this pass: nothing here can decide it. Said once.
			s.mu.Lock()
			_, known := s.mu.doubt[gid]
			s.mu.Unlock()
			if !known {
				s.log.Warn("two-phase settler: a prepared transaction is left for an operator", "gid", gid, "why", err)
			}
			left[gid] = listedAt.Add(-oldest)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("settle %s: %w", gid, err))
			left[gid] = listedAt.Add(-oldest)
			continue
		}
		settled[gid] = true
	}
	res.Left = len(left)
	s.committed.Add(int64(res.Committed))
	s.rolledBack.Add(int64(res.RolledBack))

	// Decision rows whose transaction has no part prepared anywhere are no longer
	// needed; only a pass that listed every data source can tell, and only for this
	// committer's transactions: another coordinator's rules may name data sources this
	// settler does not know, where a part of the transaction may still be prepared
	// and need the row. Their rows stay (a row is small, and one is left only when a
	// coordinator died with a commit unfinished).
	if all {
		s.each(ctx, failed, func(ctx context.Context, ds int, conn *pgconn.PgConn) error {
			var done []string
			for _, gid := range decisions[ds] {
				if _, prepared := byGID[gid]; (!prepared || settled[gid]) && s.ownGID(gid) {
					done = append(done, "'"+gid+"'")
				}
			}
			if len(done) == 0 {
				return nil
			}
			return conn.Exec(ctx, "DELETE FROM "+DecisionTable+" WHERE gid IN ("+strings.Join(done, ", ")+")").Close()
		})
	}

	// What is in doubt now: what this pass left, what commits noted since it listed,
	// and, when a data source was out of reach, what was in doubt before and not
	// settled now (it may be prepared there).
	s.mu.Lock()
	doubt := map[string]doubtEntry{}
	for gid, since := range left {
		doubt[gid] = doubtEntry{since: since, noted: start}
	}
	for gid, e := range s.mu.doubt {
		if settled[gid] {
			continue
		}
		if _, ok := left[gid]; ok {
			if e.since.Before(doubt[gid].since) {
				doubt[gid] = doubtEntry{since: e.since, noted: e.noted}
			}
			continue
		}
		if !all || e.noted.After(listedAt) || s.c.busy(gid) {
			doubt[gid] = e
		}
	}
	s.mu.doubt = doubt
	s.mu.lastPass = start
	for ds := range n {
		was := s.mu.unreachable[ds]
		now := failed[ds] != nil
		s.mu.unreachable[ds] = now
		switch {
		case now && !was:
			s.log.Warn("two-phase settler: data source unreachable", "data_source", s.c.name(ds), "err", failed[ds])
		case !now && was:
			s.log.Info("two-phase settler: data source reachable again", "data_source", s.c.name(ds))
		}
	}
	s.mu.Unlock()

	s.passes.Add(1)
	if res.Committed+res.RolledBack > 0 {
		s.log.Info("two-phase settler: finished prepared transactions", "committed", res.Committed, "rolled_back", res.RolledBack, "left", res.Left)
	}
	for ds, err := range failed {
		if err != nil {
			errs = append(errs, &ShardError{DataSource: ds, Name: s.c.name(ds), Err: fmt.Errorf("settle: %w", err)})
		}
	}
	if len(errs) > 0 {
		s.failedPasses.Add(1)
		return res, errors.Join(errs...)
	}
	return res, nil
}

// errUndecidable is a transaction a settler may not finish: no decision row in its
// reach says it committed, and it cannot tell that it was rolled back.
var errUndecidable = errors.New("sqlexec: no decision row in reach and no coordinator part to roll back")

// settle finishes the listed parts of one transaction whose coordinator is gone or
// done. Without a decision row it first rolls back the coordinator part, which decides
// for good (its coordinator, were it alive after all, can no longer commit); only then
// the other parts. When the coordinator part is not listed (gone already, or on a data
// source out of reach), the decision row, read again, says how it ended; its absence
// means a rollback only when the settler knows which data source holds it: ownRules
// says the GID's data source numbers are this settler's (its own committer made it).
// A transaction of another coordinator whose rules may number or name the data
// sources otherwise, and a legacy GID (which names no coordinator, and whose
// coordinator shows no sign of life), is then left: errUndecidable.
func (s *Settler) settle(ctx context.Context, g gidInfo, parts []preparedPart, decided bool, reachable func(int) bool, ownRules bool) (committed, rolledBack int, err error) {
	if !decided {
		rest := parts[:0:0]
		rolled := false
		for _, p := range parts {
			if g.legacy || p.gidInf.ds != g.coordinator {
				rest = append(rest, p)
				continue
			}
			err := s.step(ctx, p.on, func(ctx context.Context, conn *pgconn.PgConn) error {
				return conn.Exec(ctx, "ROLLBACK PREPARED '"+p.name+"'").Close()
			})
			switch err = classifyFinish(err); {
			case err == nil:
				rolledBack++
				rolled = true
			case !errors.Is(err, errNotPrepared):
				return committed, rolledBack, err
			}
		}
		parts = rest
		if !rolled {
			if ownRules && !reachable(g.coordinator) {
				return committed, rolledBack, fmt.Errorf("its coordinator data source %s is out of reach: the decision is unknown", s.c.name(g.coordinator))
			}
			if decided, err = s.decisionFor(ctx, g, reachable, ownRules); err != nil {
				return committed, rolledBack, err
			}
			if !decided && !ownRules {
				if g.legacy {
					return committed, rolledBack, fmt.Errorf("%w (a legacy GID: its coordinator may be alive and about to commit)", errUndecidable)
				}
				return committed, rolledBack, fmt.Errorf("%w (another coordinator's: its coordinator data source may be one this settler does not know)", errUndecidable)
			}
		}
	}
	verb := "COMMIT PREPARED"
	if !decided {
		verb = "ROLLBACK PREPARED"
	}
	var errs []error
	for _, p := range parts {
		err := s.step(ctx, p.on, func(ctx context.Context, conn *pgconn.PgConn) error {
			return conn.Exec(ctx, verb+" '"+p.name+"'").Close()
		})
		switch err = classifyFinish(err); {
		case err == nil && decided:
			committed++
		case err == nil:
			rolledBack++
		case errors.Is(err, errNotPrepared):
			// finished by someone else since the listing
		default:
			errs = append(errs, err)
		}
	}
	return committed, rolledBack, errors.Join(errs...)
}

// decisionFor reads whether g's decision row exists now: with ownRules on its
// coordinator data source, otherwise on every data source in reach.
func (s *Settler) decisionFor(ctx context.Context, g gidInfo, reachable func(int) bool, ownRules bool) (bool, error) {
	where := []int{g.coordinator}
	if !ownRules {
		where = nil
		for ds := range s.conns {
			if reachable(ds) {
				where = append(where, ds)
			}
		}
	}
	for _, ds := range where {
		var found bool
		err := s.step(ctx, ds, func(ctx context.Context, conn *pgconn.PgConn) error {
			r, err := conn.Exec(ctx, "SELECT 1 FROM "+DecisionTable+" WHERE gid = '"+g.gid+"'").ReadAll()
			found = err == nil && len(r[0].Rows) > 0
			return err
		})
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// each runs fn on the settler's connection to every data source not failed yet,
// concurrently, each within settleStepTimeout, dialling first where there is no
// connection; a data source whose fn fails is marked in failed.
func (s *Settler) each(ctx context.Context, failed []error, fn func(ctx context.Context, ds int, conn *pgconn.PgConn) error) {
	var g errgroup.Group
	g.SetLimit(8)
	for ds := range s.conns {
		if failed[ds] != nil {
			continue
		}
		g.Go(func() error {
			if err := s.connect(ctx, ds); err != nil {
				failed[ds] = err
				return nil
			}
			failed[ds] = s.step(ctx, ds, func(ctx context.Context, conn *pgconn.PgConn) error { return fn(ctx, ds, conn) })
			return nil
		})
	}
	g.Wait()
}

// step runs fn on the connection to ds within settleStepTimeout; a connection that
// fails other than by the server's answer is closed, to be dialled again next time.
func (s *Settler) step(ctx context.Context, ds int, fn func(ctx context.Context, conn *pgconn.PgConn) error) error {
	conn := s.conns[ds]
	if conn == nil {
		return errors.New("no connection")
	}
	ctx, cancel := context.WithTimeout(ctx, settleStepTimeout)
	defer cancel()
	err := fn(ctx, conn)
	if err != nil && (!answered(err) || conn.IsClosed()) {
		closeConn(conn)
		s.drop(ds)
	}
	return err
}

// connect makes sure the settler has a live connection to ds holding the instance
// lock, and the decision table exists there.
func (s *Settler) connect(ctx context.Context, ds int) error {
	if conn := s.conns[ds]; conn != nil && conn.IsClosed() {
		s.drop(ds)
	}
	if s.conns[ds] == nil {
		conn, err := s.c.dial(ctx, ds)
		if err != nil {
			return err
		}
		s.conns[ds] = conn
		// Two coordinators starting at once may race to create the table: the loser's
		// unique violation means it is there.
		err = s.step(ctx, ds, func(ctx context.Context, conn *pgconn.PgConn) error {
			err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+DecisionTable+" (gid text PRIMARY KEY, decided_at timestamptz NOT NULL DEFAULT now())").Close()
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P07") {
				return nil
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	if s.locked[ds] && !s.shared[ds] {
		return nil
	}
	// A lock held by another of the settler's connections is checked every pass: that
	// connection may have been dropped since, and this one must then take the lock.
	inst := int32(s.c.instance.Load())
	var locked bool
	var holders []lockHolder
	// Claimed before trying: a connection to the same database that fails to take
	// the lock because this one got it then finds this one among the holders.
	s.holders.Lock()
	s.holders.of[ds] = holderOf(s.conns[ds])
	s.holders.Unlock()
	err := s.step(ctx, ds, func(ctx context.Context, conn *pgconn.PgConn) error {
		r, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_try_advisory_lock(%d, %d)", InstanceLockClass, inst)).ReadAll()
		if err != nil {
			return err
		}
		if locked = len(r) == 1 && len(r[0].Rows) == 1 && string(r[0].Rows[0][0]) == "t"; locked {
			return nil
		}
		r, err = conn.Exec(ctx, fmt.Sprintf("SELECT l.pid, coalesce(a.client_port, -1) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "+
			"WHERE l.locktype = 'advisory' AND l.classid = %d AND l.objid = %d AND l.objsubid = 2 AND l.granted "+
			"AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())", InstanceLockClass, uint32(inst))).ReadAll()
		if err != nil {
			return err
		}
		for _, row := range r[0].Rows {
			pid, _ := strconv.Atoi(string(row[0]))
			port, _ := strconv.Atoi(string(row[1]))
			holders = append(holders, lockHolder{pid, port})
		}
		return nil
	})
	s.holders.Lock()
	defer s.holders.Unlock()
	if err != nil {
		s.holders.of[ds] = lockHolder{}
		return err
	}
	if locked {
		s.locked[ds], s.shared[ds] = true, false
		return nil
	}
	s.holders.of[ds] = lockHolder{}
	for _, h := range holders {
		if h.pid != 0 && slices.Contains(s.holders.of, h) {
			s.locked[ds], s.shared[ds] = true, true
			return nil
		}
	}
	s.locked[ds], s.shared[ds] = false, false
	// Our own earlier connection may still hold it on the server (a step that timed
	// out); try again next pass.
	s.log.Warn("two-phase settler: the instance lock is held by another session", "data_source", s.c.name(ds))
	return nil
}

// holderOf is the backend of conn, as pg_locks and pg_stat_activity show it.
func holderOf(conn *pgconn.PgConn) lockHolder {
	h := lockHolder{pid: int(conn.PID()), port: -1}
	if a, ok := conn.Conn().LocalAddr().(*net.TCPAddr); ok {
		h.port = a.Port
	}
	return h
}

// ownGID reports whether gid (without the data source suffix) is one this settler's
// committer made, which also makes it safe to put in a statement.
func (s *Settler) ownGID(gid string) bool {
	g, ok := parseGID(gid + "_0")
	return ok && !g.legacy && g.instance == s.c.instance.Load()
}
