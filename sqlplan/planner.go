package sqlplan

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/rules"
)

// Options tunes a Planner. The zero value is usable.
type Options struct {
	// CacheSize bounds the plan cache, in plans; default DefaultCacheSize. Negative
	// turns the cache off.
	CacheSize int
	// Coordinate sends a SELECT that the merge cannot answer exactly over several
	// shards to the coordinator database (package coordinator) as the client wrote it,
	// where PostgreSQL evaluates it over every shard's rows: its plan is
	// KindCoordinator, or its Bind targets the coordinator (Bound.Coordinated). Without
	// it such a SELECT is refused with 0A000.
	Coordinate bool
	// ShardAggregates: the coordinator database is package coordinator's, whose
	// shards are foreign tables of their own (CoordinatorShardTable). A coordinated
	// SELECT that aggregates one sharded table then has each shard aggregate its own
	// rows there, and the coordinator combine one row per group per shard (see
	// shardAggregates), instead of every row moving to it.
	ShardAggregates bool
}

// DefaultCacheSize is the plan cache's default bound.
const DefaultCacheSize = 4096

// Planner plans statements against a set of rules. It is safe for concurrent use.
type Planner struct {
	rules      *rules.Compiled
	cat        Catalog
	cache      *planCache
	coordinate bool
	shardAggs  bool

	bufs sync.Pool // *[]byte keys for cache lookups
}

// New returns a planner over compiled rules. cat answers what the rules leave out
// (column types and order, which functions are aggregates); it may be nil when every
// sharding column has a declared type, every INSERT names its columns and no query
// calls a user-defined aggregate across shards.
func New(r *rules.Compiled, cat Catalog, o Options) *Planner {
	size := o.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	p := &Planner{rules: r, cat: cat, coordinate: o.Coordinate, shardAggs: o.ShardAggregates}
	if size > 0 {
		p.cache = newPlanCache(size)
	}
	p.bufs.New = func() any { b := make([]byte, 0, 256); return &b }
	return p
}

// Rules returns the planner's rules.
func (p *Planner) Rules() *rules.Compiled { return p.rules }

// Prepare plans one extended-protocol statement: $1, $2 ... are parameters whose values
// come with Bind. Plans are cached by text.
func (p *Planner) Prepare(ctx context.Context, sql string) (*Plan, error) {
	if p.cache != nil {
		if pl, ok := p.cache.get(sql, 'E'); ok {
			return pl, nil
		}
	}
	pl, err := p.plan(ctx, sql, sql, false, nil)
	if err != nil {
		return nil, err
	}
	if p.cache != nil && cacheable(pl) {
		p.cache.put(sql, 'E', pl)
	}
	return pl, nil
}

// Simple plans and binds one simple-protocol statement, whose values are literals in
// its text. Statements that differ only in their literal values share a cached plan.
// A string holding several statements must be split first (SplitStatements).
func (p *Planner) Simple(ctx context.Context, sql string) (*Bound, error) {
	pl, lits, err := p.PlanSimple(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pl.bind(sql, lits, Args{})
}

// PlanSimple is Simple without the binding: the plan, and the literals of sql to bind
// it with (BindSimple).
func (p *Planner) PlanSimple(ctx context.Context, sql string) (*Plan, []Literal, error) {
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	key, lits, ok := normalize((*bp)[:0], sql, nil)
	*bp = key
	if !ok {
		// Not normalisable: plan the text as it is, cached by its full text.
		if p.cache != nil {
			if pl, hit := p.cache.get(sql, 'S'); hit {
				return pl, nil, nil
			}
		}
		pl, err := p.plan(ctx, sql, sql, false, nil)
		if err != nil {
			return nil, nil, err
		}
		if p.cache != nil && cacheable(pl) && len(sql) <= maxCachedText {
			p.cache.put(sql, 'S', pl)
		}
		return pl, nil, nil
	}
	if p.cache != nil {
		if pl, hit := p.cache.getBytes(key, 'N'); hit && pl.pinnedMatch(sql, lits) {
			return pl, lits, nil
		}
	}
	normalized := string(key[:strings.IndexByte(string(key), 0)])
	pl, err := p.plan(ctx, sql, normalized, true, lits)
	if err != nil {
		return nil, nil, err
	}
	if !pl.normalized {
		// The normalised text did not parse (a literal where the grammar wants a
		// constant): the plan is for this exact text.
		if p.cache != nil && cacheable(pl) && len(sql) <= maxCachedText {
			p.cache.put(sql, 'S', pl)
		}
		return pl, nil, nil
	}
	if p.cache != nil && cacheable(pl) && len(key) <= maxCachedText {
		p.cache.put(string(key), 'N', pl)
	}
	return pl, lits, nil
}

// maxCachedText bounds the text of a cached statement; longer ones are planned each time.
const maxCachedText = 16 << 10

func cacheable(pl *Plan) bool { return pl.Kind != KindDDL }

// Literal is a literal value of a simple-protocol statement: its place in the text.
type Literal struct {
	Start, End int
	String     bool // a quoted string, else a number
}

// pinnedMatch reports whether sql has the literal values the plan depends on.
func (pl *Plan) pinnedMatch(sql string, lits []Literal) bool {
	for _, pin := range pl.pinned {
		if pin.index >= len(lits) {
			return false
		}
		l := lits[pin.index]
		if sql[l.Start:l.End] != pin.text {
			return false
		}
	}
	return true
}

// SplitStatements splits a simple-protocol query string into its statements as
// PostgreSQL's grammar reads them (see splitStatements).
func SplitStatements(sql string) []string { return splitStatements(sql) }

// plan parses text (the client's sql, or its normalised form) and analyses it.
func (p *Planner) plan(ctx context.Context, sql, text string, normalized bool, lits []Literal) (*Plan, error) {
	if strings.Contains(text, markerPrefix) {
		return nil, unsupported("identifiers starting with %q are reserved by the sharding layer", markerPrefix)
	}
	tree, err := pg.Parse(text)
	if err != nil && normalized {
		// A literal stood where the grammar takes only a constant (SET x = 'y', say):
		// plan the original text instead.
		return p.plan(ctx, sql, sql, false, nil)
	}
	if err != nil {
		if p.rules.OneShard() {
			// One shard: the server says what is wrong, in its own words and with
			// every field (a HINT, a DETAIL), or runs what its grammar takes.
			return &Plan{Kind: KindPassthrough, SQL: sql, rules: p.rules, Write: true, Session: EffectBinds | EffectUnbinds, Unparsed: true}, nil
		}
		return nil, syntaxError(err)
	}
	if normalized && len(tree.Stmts) == 1 && (isDDLNode(tree.Stmts[0].Stmt) || tree.Stmts[0].Stmt.GetCopyStmt() != nil) {
		// DDL and COPY are planned each time, from their own text: the statements
		// they send are never bound (a COPY's WHERE clause keeps its literals).
		return p.plan(ctx, sql, sql, false, nil)
	}
	if n := slotParam(tree); n > 0 {
		// Those numbers stand for the planner's own values (see slotBase).
		return nil, pgErr("42P02", "there is no parameter $%d", n)
	}
	switch len(tree.Stmts) {
	case 0:
		return &Plan{Kind: KindEmpty, SQL: sql, rules: p.rules}, nil
	case 1:
	default:
		return nil, pgErr(CodeSyntaxError, "cannot insert multiple commands into a prepared statement")
	}
	a := &analyzer{
		ctx: ctx, p: p, sql: sql, text: text, normalized: normalized, lits: lits,
		plan: &Plan{SQL: sql, rules: p.rules, normalized: normalized},
		tree: tree,
	}
	if normalized {
		for _, l := range lits {
			a.plan.litKinds = append(a.plan.litKinds, l.String)
		}
	}
	// Before the analysis, which renames table references in the tree.
	effects := sessionEffects(text, tree.Stmts[0].Stmt)
	var coord *coordination
	if p.coordinate {
		coord = p.checkCoordination(ctx, tree.Stmts[0].Stmt)
	}
	placed := p.placedTables(tree.Stmts[0].Stmt)
	err = a.analyze(tree.Stmts[0].Stmt)
	if err == nil {
		if err = a.followed(placed); err != nil {
			a.pre = nil // its steps would not follow the table either
		}
	}
	if err != nil {
		if errors.Is(err, errAsWritten) {
			return p.plan(ctx, sql, sql, false, nil)
		}
		if errors.Is(err, ErrUnsupported) && p.rules.OneShard() {
			// One shard: whatever its server runs is exact as written.
			return p.passthrough(sql, text, normalized, tree, effects)
		}
		if errors.Is(err, ErrUnsupported) && coord != nil {
			return p.coordinated(sql, text, normalized, tree, effects, err, coord)
		}
		if errors.Is(err, ErrUnsupported) && a.pre != nil {
			// Refused as it stands; the caller may evaluate its subqueries first. The
			// analysis stopped part way: the tables it did not reach are named too.
			tables := a.plan.Tables
			for _, name := range placed {
				tables = appendUnique(tables, name)
			}
			return &Plan{Kind: a.plan.Kind, SQL: sql, Write: true, Tables: tables, rules: p.rules, normalized: normalized,
				litKinds: a.plan.litKinds, NumParams: paramCount(a.maxParam, normalized), Session: effects, refuse: err, Pre: a.pre}, nil
		}
		var pe interface{ SQLState() string }
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, pgErr(CodeInternalError, "shardlab: %v", err)
	}
	a.plan.NumParams = a.maxParam
	a.plan.Session = effects
	a.plan.Pre = a.pre
	if coord != nil && coord.inexact == nil && (a.plan.Kind == KindSelect || a.plan.Kind == KindExplain) {
		a.plan.coordinate, a.plan.shardAggs, a.plan.joins = true, p.shardAggs, coord.joins
	}
	if normalized {
		a.plan.NumParams = 0
	}
	return a.plan, nil
}

// placedTables returns the tables a statement names (before the analysis renames
// them) that the rules place elsewhere than on the default data source alone, but for
// names a WITH clause of the statement defines.
func (p *Planner) placedTables(stmt *pg.Node) []string {
	return slices.DeleteFunc(namedTables(stmt), func(n string) bool { return p.rules.Lookup(n).Kind == rules.KindDefault })
}

// namedTables returns the tables a statement, or a part of one, names, but for names
// its WITH clauses define.
func namedTables(n proto.Message) []string {
	var names []string
	ctes := map[string]bool{}
	walk(n, func(m proto.Message) bool {
		switch n := m.(type) {
		case *pg.RangeVar:
			names = appendUnique(names, n.Relname)
		case *pg.CommonTableExpr:
			ctes[n.Ctename] = true
		}
		return true
	})
	return slices.DeleteFunc(names, func(n string) bool { return ctes[n] })
}

// followed checks that the analysis of a SELECT, INSERT, UPDATE or DELETE found every
// table of placed: a table it did not follow (in a part of the statement it does not
// look into) would be read where the statement is sent, not where its rows are.
func (a *analyzer) followed(placed []string) error {
	switch a.plan.Kind {
	case KindSelect, KindInsert, KindUpdate, KindDelete:
	default:
		return nil
	}
	for _, name := range placed {
		if !slices.Contains(a.plan.Tables, name) {
			return unsupported("table %s in a part of the statement the sharding layer does not route (TABLESAMPLE, or a construct it does not look into)", name)
		}
	}
	return nil
}

// passthrough plans a statement the analysis refused, for rules of one shard: it runs
// on that shard as the client wrote it. A normalised text is planned again from the
// client's own, whose literals the statement keeps.
func (p *Planner) passthrough(sql, text string, normalized bool, tree *pg.ParseResult, effects SessionEffects) (*Plan, error) {
	a, err := p.asWritten(sql, text, normalized, tree)
	if err != nil {
		return nil, err
	}
	tree = a.tree
	switch n := tree.Stmts[0].Stmt.Node.(type) {
	case *pg.Node_PrepareStmt, *pg.Node_CreateFunctionStmt:
		// The $n inside are the prepared statement's or the function's, not this one's.
	case *pg.Node_ExplainStmt:
		a.noteParams(n.ExplainStmt)
	default:
		a.noteParams(tree.Stmts[0].Stmt)
	}
	pl := &Plan{Kind: KindPassthrough, SQL: sql, rules: p.rules, Session: effects, NumParams: a.maxParam,
		NoTransaction: noTransaction(tree.Stmts[0].Stmt)}
	switch tree.Stmts[0].Stmt.Node.(type) {
	case *pg.Node_DeclareCursorStmt, *pg.Node_PrepareStmt:
		pl.OwnText = true
	}
	_, isSelect := tree.Stmts[0].Stmt.Node.(*pg.Node_SelectStmt)
	pl.Write = !isSelect
	return pl, nil
}

// asWritten returns an analyzer of the client's own text, for a plan that sends the
// statement as written: a normalised text is parsed again from the client's, whose
// literals the statement keeps.
func (p *Planner) asWritten(sql, text string, normalized bool, tree *pg.ParseResult) (*analyzer, error) {
	if normalized {
		t, err := pg.Parse(sql)
		if err != nil {
			return nil, syntaxError(err)
		}
		tree, text = t, sql
	}
	return &analyzer{p: p, sql: sql, text: text, tree: tree}, nil
}

// noTransaction reports whether PostgreSQL refuses a statement inside a transaction
// block, so that it is never wrapped in one.
func noTransaction(stmt *pg.Node) bool {
	switch n := stmt.Node.(type) {
	case *pg.Node_CreatedbStmt, *pg.Node_DropdbStmt, *pg.Node_CreateTableSpaceStmt, *pg.Node_DropTableSpaceStmt,
		*pg.Node_AlterSystemStmt, *pg.Node_VacuumStmt:
		return true
	case *pg.Node_ReindexStmt:
		for _, o := range n.ReindexStmt.Params {
			if o.GetDefElem().GetDefname() == "concurrently" {
				return true
			}
		}
	case *pg.Node_IndexStmt:
		return n.IndexStmt.Concurrent
	}
	return false
}

// literalText returns the value of literal i of sql: a string literal unquoted, a
// number as written.
func literalText(sql string, l Literal) string {
	s := sql[l.Start:l.End]
	if !l.String {
		return s
	}
	s = s[1 : len(s)-1]
	if strings.Contains(s, "''") {
		s = strings.ReplaceAll(s, "''", "'")
	}
	return s
}
