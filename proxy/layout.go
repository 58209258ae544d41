package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy/admin"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/reshard"
	"github.com/shardlab/shardlab/rules"
)

// SwitchLayout routes by layout l from now on: a router over pools of l's data sources
// takes the place of the one in force (router.Router.Supersede), and the old one's
// pools close. The router in force must be paused with no transaction in flight; its
// held clients go on, on l, once it resumes. PrepareLayout does the same in two steps,
// so that the new router is made and its pools warmed before the pause.
func (s *Server) SwitchLayout(ctx context.Context, l *rules.Compiled) error {
	sw, _, err := s.PrepareLayout(ctx, l)
	if err != nil {
		return err
	}
	return sw()
}

// PrepareLayout makes a router for layout l and warms its pools (as many connections
// to each data source as the router in force has open to the busiest of its own) while
// the proxy serves on. sw puts it in force (see SwitchLayout) once the proxy is paused;
// discard closes it instead. A resharding cutover prepares before its hold, so that
// the hold does not wait for new connections, and clients meet warm pools after it:
// each connection has read (nothing from) the tables it serves where it could, and the
// new router holds the plans and statement descriptions of the one in force
// (router.Router.Warm).
func (s *Server) PrepareLayout(ctx context.Context, l *rules.Compiled) (sw func() error, discard func(), err error) {
	given := l
	if s.cfg.Aggregate {
		merged, _, err := AggregateSchemas(l)
		if err != nil {
			return nil, nil, fmt.Errorf("proxy: aggregate: %w", err)
		}
		l = merged
	}
	n, err := s.newRouter(l)
	if err != nil {
		return nil, nil, err
	}
	discard = func() {
		n.Close()
		for _, p := range n.AllPools() {
			p.Close()
		}
	}
	if err := n.StartSettler(ctx); err != nil {
		discard()
		return nil, nil, err
	}
	cur := s.Router()
	warm := 0
	for _, p := range cur.Pools() {
		st := p.Stats()
		warm = max(warm, int(st.InUse+st.Idle))
	}
	for ds, p := range n.Pools() {
		var held []*backend.Conn
		for range min(warm, p.Stats().Size-1) {
			c, err := p.Acquire(ctx)
			if err != nil {
				break // the pool dials on demand later
			}
			held = append(held, c)
		}
		for _, c := range held {
			// Best effort: a table the server cannot read now is read by the
			// client's own statement, which reports it. (Release drops a connection
			// left broken.)
			if err := n.WarmConn(ctx, ds, c); err != nil {
				s.log.Debug("warming a connection of the new layout", "data_source", p.Name(), "err", err)
			}
			p.Release(c, true)
		}
	}
	// The plans and descriptions of the router in force, made on n: its clients'
	// first statements after the switch find them.
	plans, descriptions := n.Warm(ctx, cur)
	s.log.Info("layout prepared", "layout", l.Digest(), "connections_per_data_source", warm, "plans", plans, "descriptions", descriptions)
	sw = func() error {
		old := s.Router()
		if err := old.Supersede(n); err != nil {
			return err
		}
		s.layout.Store(given)
		// No session starts a unit on the old router any more (each moves to n as
		// its next unit starts): it closes once the units that passed the pause
		// (router.Router.PauseTables) end, beside the held clients going on.
		go func() {
			<-old.UnitsEnded()
			old.Close()
			for _, p := range old.AllPools() {
				p.Close()
			}
		}()
		s.log.Info("layout switched", "layout", l.Digest(), "data_sources", l.NumDataSources(), "views", len(l.TableNames()))
		return nil
	}
	return sw, discard, nil
}

// reshardProxy is the proxy as a resharding move sees it.
type reshardProxy struct{ s *Server }

// Pause holds the transactions that touch the tables a move changes: the sharded and
// broadcast ones (a reshard keeps the default data source and its tables where they
// are). The others go on through the hold.
func (p reshardProxy) Pause(ctx context.Context) (func() error, error) {
	r := p.s.Router()
	l := r.Rules()
	moving := func(table string) bool { return l.Lookup(table).Kind != rules.KindDefault }
	if err := r.PauseTables(ctx, moving); err != nil {
		return nil, err
	}
	return r.Resume, nil
}

func (p reshardProxy) Prepare(ctx context.Context, l *rules.Compiled) (func() error, func(), error) {
	return p.s.PrepareLayout(ctx, l)
}

// reshardCommand carries out the admin console's RESHARD CUTOVER 'file' [VERIFY
// seconds], RESHARD FINISH [rate] and RESHARD REVERT: one at a time.
func (s *Server) reshardCommand(ctx context.Context, c admin.Reshard) (*admin.Result, error) {
	if !s.reshardMu.TryLock() {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "55006", Message: "a RESHARD command is running already"}
	}
	defer s.reshardMu.Unlock()
	s.resharding.Store(true)
	defer s.resharding.Store(false)
	if paused, _ := s.Router().Paused(); paused {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: "the proxy is paused (PAUSE): RESUME first"}
	}
	var out strings.Builder
	current := s.layout.Load()
	switch c.Verb {
	case "CUTOVER":
		if len(current.TableNames()) > 0 {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: "RESHARD CUTOVER: the last move is cut over and not finished: RESHARD FINISH first"}
		}
		to, err := rules.Load(c.Rules)
		if err != nil {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "22023", Message: "RESHARD CUTOVER: " + err.Error()}
		}
		rep, err := reshard.Cutover(ctx, current, to, reshardProxy{s}, reshard.CutoverOptions{Drain: s.cfg.ReshardDrain, CatchUp: s.cfg.ReshardCatchUp, Verify: c.Verify, Progress: &out})
		if s.layout.Load() != current {
			s.cutFrom = current // switched, even if a step after the switch failed
		}
		if err != nil {
			return nil, reshardError(err)
		}
		s.log.Info("reshard: cut over", "version", rep.Version, "pause", rep.Pause)
		return holdResult(rep), nil
	case "FINISH":
		from, err := s.movedFrom(ctx, "RESHARD FINISH")
		if err != nil {
			return nil, err
		}
		// The target itself, without the views the proxy reads through until now.
		rep, err := reshard.Finish(ctx, from, current.WithTableNames(nil), reshardProxy{s}, reshard.FinishOptions{Drain: s.cfg.ReshardDrain, Rate: c.Rate, Progress: &out})
		if err != nil {
			return nil, reshardError(err)
		}
		s.cutFrom = nil
		r := &admin.Result{Tag: "RESHARD", Columns: []string{"item", "value"}, Types: []uint32{admin.Text, admin.Text}}
		for _, k := range slices.Sorted(maps.Keys(rep.Deleted)) {
			r.Rows = append(r.Rows, []string{"deleted " + k, fmt.Sprint(rep.Deleted[k])})
		}
		r.Rows = append(r.Rows, []string{"pause_ms", fmt.Sprintf("%.3f", float64(rep.Pause.Microseconds())/1000)})
		return r, nil
	case "REVERT":
		from, err := s.movedFrom(ctx, "RESHARD REVERT")
		if err != nil {
			return nil, err
		}
		rep, err := reshard.Revert(ctx, from, current.WithTableNames(nil), reshardProxy{s}, reshard.CutoverOptions{Drain: s.cfg.ReshardDrain, CatchUp: s.cfg.ReshardCatchUp, Progress: &out})
		if err != nil {
			return nil, reshardError(err)
		}
		s.cutFrom = nil
		s.log.Info("reshard: reverted", "version", rep.Version, "pause", rep.Pause)
		return holdResult(rep), nil
	}
	return nil, &pgconn.PgError{Severity: "ERROR", Code: "42601", Message: "RESHARD takes CUTOVER 'rules file' [VERIFY seconds], FINISH [rows per second] or REVERT"}
}

// movedFrom returns the rules of the move that was cut over to this proxy's layout, the
// layout it came from.
func (s *Server) movedFrom(ctx context.Context, command string) (*rules.Compiled, error) {
	current := s.layout.Load()
	rec, err := reshard.ReadLayout(ctx, current)
	if err != nil {
		return nil, reshardError(err)
	}
	if rec != nil && rec.Digest == current.Digest() && rec.Phase == "reverting" {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: command + ": a revert to this proxy's layout did not end: run reshard revert with both rules files to complete it"}
	}
	if rec == nil || rec.From == nil || rec.Digest != current.Digest() {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: command + ": no move of this proxy's layout was cut over"}
	}
	// The record keeps the old rules without DSNs: a data source keeps its name and
	// DSN from one layout to the next, so the proxy's own say how to reach it, and
	// those it routed by before its own cutover say how to reach the data sources the
	// move left (a move to new data sources).
	fromRules := *rec.From
	fromRules.DataSources = slices.Clone(fromRules.DataSources)
	dsn := map[string]string{}
	for _, l := range []*rules.Compiled{s.cutFrom, current} {
		if l == nil {
			continue
		}
		for _, d := range l.DataSources() {
			dsn[d.Name] = d.DSN
		}
	}
	for i, d := range fromRules.DataSources {
		if dsn[d.Name] == "" {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: command + ": the move came from data source " + d.Name + ", which this proxy's rules do not name (it was cut over by another process); run the reshard command with both rules files"}
		}
		fromRules.DataSources[i].DSN = dsn[d.Name]
	}
	from, err := rules.Compile(fromRules)
	if err != nil {
		return nil, reshardError(err)
	}
	return from, nil
}

// holdResult is the admin console's answer to a RESHARD command that held the proxy:
// its steps' durations.
func holdResult(rep *reshard.CutoverReport) *admin.Result {
	r := &admin.Result{Tag: "RESHARD", Columns: []string{"step", "ms"}, Types: []uint32{admin.Text, admin.Text}}
	for _, st := range []struct {
		name string
		d    time.Duration
	}{{"drain", rep.Drain}, {"catch_up", rep.CatchUp}, {"switch", rep.Switch}, {"pause", rep.Pause}} {
		r.Rows = append(r.Rows, []string{st.name, fmt.Sprintf("%.3f", float64(st.d.Microseconds())/1000)})
	}
	for _, st := range rep.Steps {
		r.Rows = append(r.Rows, []string{"catch_up." + st.Name, fmt.Sprintf("%.3f", float64(st.Took.Microseconds())/1000)})
	}
	r.Rows = append(r.Rows, []string{"layout_version", fmt.Sprint(rep.Version)})
	return r
}

// reshardError is a move's error as the admin console answers it.
func reshardError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return err
	}
	code := "55000"
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, reshard.ErrCutover) {
		code = "57014"
	}
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: err.Error()}
}

// checkLayout returns the rules to route by, given rules l (reshard.InForce).
func checkLayout(ctx context.Context, l *rules.Compiled) (*rules.Compiled, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return reshard.InForce(ctx, l)
}

var _ reshard.Proxy = reshardProxy{}

// ReshardProxy returns the proxy as a resharding move switches it (reshard.Cutover,
// reshard.Finish), for a move driven from the same process.
func (s *Server) ReshardProxy() reshard.Proxy { return reshardProxy{s} }
