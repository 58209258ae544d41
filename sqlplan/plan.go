// Package sqlplan turns SQL written against logical tables into plans that run on the
// physical shards: which shards, which rewritten SQL, and how to merge their answers.
//
// It parses with PostgreSQL's own grammar (pg_query), finds the tables and the
// sharding-key conditions of SELECT, INSERT, UPDATE and DELETE, routes them with
// package rules, rewrites table names, and describes cross-shard merges (merge-sort,
// aggregates, DISTINCT, LIMIT) that package sqlexec carries out.
//
// Its rule is the project's: a statement is answered exactly as one database would
// answer it, or refused with SQLSTATE 0A000 naming the construct. Some refusals depend
// on values only known at bind time (a window function is fine when the key pins one
// shard, not when the statement spans several), so Bind can refuse too.
//
// Plans are cached, bounded, by statement text. Simple-protocol statements carry their
// values inline; the cache replaces literals by parameters first (see normalize), so
// `SELECT c FROM sbtest1 WHERE id=42` and `... id=43` share one plan.
package sqlplan

import (
	"context"
	"fmt"
	"strings"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// Kind classifies a statement.
type Kind int

// Statement kinds.
const (
	KindEmpty       Kind = iota // nothing but comments
	KindSelect                  // SELECT, VALUES, TABLE
	KindInsert                  // INSERT
	KindUpdate                  // UPDATE
	KindDelete                  // DELETE
	KindDDL                     // CREATE, ALTER, DROP, TRUNCATE, VACUUM, ANALYZE, COMMENT, GRANT ...
	KindTransaction             // BEGIN, COMMIT, ROLLBACK, SAVEPOINT ...: the session handles it
	KindSet                     // SET, RESET: session state, replayed on every backend the session uses
	KindShow                    // SHOW: any backend answers
	KindCopy                    // COPY: the session streams it (see Plan.Copy)
	KindExplain                 // EXPLAIN of a statement that runs on one target
	KindDiscard                 // DISCARD
	KindLock                    // LOCK TABLE
	KindListen                  // LISTEN, UNLISTEN, NOTIFY: on the default data source, where every client's notifications meet
	KindPassthrough             // anything else one server runs, where the rules have one shard (rules.Compiled.OneShard): sent as written
	KindCoordinator             // a SELECT the merge cannot answer exactly, sent as written to the coordinator database (Options.Coordinate)
)

var kindNames = [...]string{"empty", "select", "insert", "update", "delete", "ddl", "transaction", "set", "show", "copy", "explain", "discard", "lock", "listen", "passthrough", "coordinator"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// TxKind says which transaction-control statement a KindTransaction plan is.
type TxKind int

// Transaction statements.
const (
	TxNone TxKind = iota
	TxBegin
	TxCommit
	TxRollback
	TxSavepoint
	TxRelease
	TxRollbackTo
	TxPrepare         // PREPARE TRANSACTION: with rules of one shard, run there and ending the transaction; refused over several (the sharding layer runs its own 2PC)
	TxCommitPrepared  // COMMIT PREPARED: likewise
	TxRollbackPrepare // ROLLBACK PREPARED: likewise
)

// Catalog answers what a plan needs to know about tables that their rules do not say.
// Implementations cache; package sqlexec has one that reads a shard's catalog.
type Catalog interface {
	// KeyType returns the type of a table's sharding column as PostgreSQL declares it
	// (for rules that leave the type out). It returns a 42P01 *pgconn.PgError for a
	// table that does not exist.
	KeyType(ctx context.Context, table *rules.TableRule, column string) (rules.KeyType, error)
	// Columns returns a table's column names in order (for INSERT without a column list).
	Columns(ctx context.Context, table *rules.TableRule) ([]string, error)
	// IsAggregate reports whether an unqualified function name is an aggregate, built in
	// or user-defined, so that a user's aggregate is not mistaken for a plain function.
	IsAggregate(ctx context.Context, name string) (bool, error)
}

// Plan is a planned statement. It is immutable and shared by every execution of the
// same statement text; Bind fixes the values of one execution.
type Plan struct {
	Kind Kind
	// SQL is the statement as the client sent it (one statement).
	SQL string
	// Tables are the logical tables the statement names, in order of appearance.
	Tables []string
	// Write is true for statements that change data or schema.
	Write bool
	// Returning is set for an INSERT, UPDATE or DELETE with RETURNING: it answers rows.
	Returning bool
	// NoTransaction is set for statements PostgreSQL refuses inside a transaction block
	// (VACUUM, CREATE INDEX CONCURRENTLY): they are never wrapped in one.
	NoTransaction bool
	// OwnText is set for statements whose text the server keeps and shows (a cursor's
	// DECLARE in pg_cursors, an SQL-level PREPARE in pg_prepared_statements): they
	// travel alone, never in one query string with statements the proxy adds.
	OwnText bool
	// Unparsed is set for a passthrough plan of a statement the planner's grammar
	// refused (rules of one shard): the server's own parse says what is wrong.
	Unparsed bool
	// Tx is set for KindTransaction.
	Tx TxKind
	// Chain is set for COMMIT AND CHAIN and ROLLBACK AND CHAIN: a new transaction with
	// the same characteristics (isolation level, read only, deferrable) starts at once.
	Chain bool
	// Savepoint is the savepoint a SAVEPOINT, RELEASE or ROLLBACK TO statement names,
	// as PostgreSQL's grammar reads it, quoted as an identifier ("a b"), so that every
	// data source reads it alike.
	Savepoint string
	// NumParams is the number of $n parameters the statement takes.
	NumParams int
	// Copy describes a COPY statement (KindCopy).
	Copy *CopySpec
	// Session says what the statement may do to its server connection's session
	// (settings through set_config, temporary objects, advisory locks).
	Session SessionEffects
	// Keys, on an INSERT into a sharded table that leaves its key to the column's
	// sequence, says where the keys come from: the caller draws them (Args.Keys)
	// before Bind, which routes each row by its key.
	Keys *KeySource
	// Feed, on an INSERT ... SELECT into a sharded table, says how the caller runs it:
	// the query first, then its rows in batches. Bind gives it no targets.
	Feed *Feed
	// Pre, on an UPDATE or DELETE with subqueries over sharded tables, says how the
	// caller may still run it when Bind refuses it (0A000): those subqueries first.
	Pre *Pre

	rules      *rules.Compiled
	normalized bool        // values are literals of the statement text (simple protocol)
	litKinds   []bool      // for a normalised plan: whether each literal is a string
	pinned     []pinnedLit // literals whose value the plan depends on
	refs       []*tableRef // every table reference, in AST order
	route      *routeSpec
	merge      *MergeSpec
	insert     *insertSpec
	keyUpdates []keyUpdate // assignments to a sharding key (UPDATE, ON CONFLICT)
	tmpl       *template   // nil: every target runs the client's text unchanged
	mergeTmpl  *template   // the statement each shard runs when a merge combines them
	ddl        *ddlSpec
	// singleOnly lists constructs that are exact only on one target; Bind refuses the
	// plan, naming the first, when the values make it span several.
	singleOnly []string
	// refuse, when set, is returned by every Bind: a construct no target can answer.
	refuse error
	// coordinate is set, on a SELECT, when the coordinator may answer what the merge
	// refuses at Bind (Options.Coordinate): a construct exact on one shard only, or a
	// join or subquery whose values do not pin one shard.
	coordinate bool
	shardAggs  bool         // see Options.ShardAggregates
	joins      *joinCatalog // of the tables it joins, for shardAggregates
	// Refused is, on a KindCoordinator plan, why the merge could not answer it.
	Refused error
	memo    sync.Map // see Memo
}

// pinnedLit is a literal whose text the plan was made for (ORDER BY 1 names a column):
// a statement differing there needs a plan of its own.
type pinnedLit struct {
	index int // 0-based literal index
	text  string
}

// CopySpec describes COPY ... FROM STDIN or TO STDOUT.
type CopySpec struct {
	Table   *rules.TableRule
	Columns []string // the column list, or nil for every column
	From    bool     // COPY FROM STDIN (load); false: COPY TO STDOUT
	// Options are the statement's WITH (...) options.
	Options []CopyOption
	// SQL is the statement for each of Table's nodes (physical tables), in node order.
	SQL []string
	// Query is set for COPY (query) TO STDOUT: the query, to be planned and bound as a
	// statement of its own; Table is nil. Wrap is the COPY statement around
	// CopyQueryMarker, with the client's options, for a target that answers the query
	// alone.
	Query, Wrap string
	// Server is set for COPY to or from a server file or program that the data source
	// of Table's first node runs as written (SQL[0]): the table has one copy of its rows.
	Server bool
	// Stage is set for COPY FROM a server file or program into a table over several
	// data sources: the statement that reads the file, with the client's options, into
	// the temporary table pg_temp.CopyStageTable of the copied columns, on the data
	// source of Table's first node. Its rows then load through SQL, which reads COPY's
	// text format from STDIN.
	Stage string
}

// tableRef is one reference to a logical table in a statement.
type tableRef struct {
	rule   *rules.TableRule
	name   string // as written (relname)
	alias  string // the alias, or "" when none
	schema string
	scope  *scope
	// keyTypes are the sharding columns' types, from the rule or the catalog.
	keyTypes map[string]rules.KeyType
	index    int // position in Plan.refs
	// inDDL is set for references in DDL, which take no alias.
	inDDL bool
	// rangeVar is the reference in the parse tree, renamed to a marker for templates.
	rangeVar *pg.RangeVar
}

func (r *tableRef) sharded() bool { return r.rule.Kind == rules.KindSharded }

// qualifier is the name a column reference uses for this table.
func (r *tableRef) qualifier() string {
	if r.alias != "" {
		return r.alias
	}
	return r.name
}

// Reusable reports whether the statements a plan sends to its shards are worth
// preparing once per backend connection: data statements of the extended protocol,
// which come back with other parameter values. Simple-protocol statements carry their
// values in the text, so each text is seen once.
func (p *Plan) Reusable() bool {
	if p.normalized || p.NumParams == 0 {
		return false
	}
	switch p.Kind {
	case KindSelect, KindInsert, KindUpdate, KindDelete:
		return true
	}
	return false
}

// Explain describes the plan: its kind, the tables, and what is known without values.
func (p *Plan) Explain() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", p.Kind)
	for _, r := range p.refs {
		fmt.Fprintf(&b, " %s(%s)", r.name, r.rule.Kind)
	}
	if p.merge != nil {
		fmt.Fprintf(&b, "; merge: %s", p.merge)
	}
	if len(p.singleOnly) > 0 {
		fmt.Fprintf(&b, "; one shard only: %s", strings.Join(p.singleOnly, ", "))
	}
	return b.String()
}

// Destination is where a bound statement runs: the data sources, with for each the
// shard (physical table set) it runs against.
type Target struct {
	// DataSource is the index of the data source the statement runs on.
	DataSource int
	// Shard is the shard (node) index of the statement's sharded tables, or -1 when the
	// target is a whole data source (broadcast, default or DDL statements).
	Shard int
	// SQL is the statement for this target.
	SQL string
	// Params maps the target's $1, $2 ... to the client's parameters (0-based indexes);
	// nil means the client's parameters, unchanged.
	Params []int
	// rowOrder is, for a split multi-row INSERT, the client's row index of each row this
	// target inserts (to put RETURNING rows back in the client's order).
	RowOrder []int
}

// Bound is a plan with the values of one execution: the targets and how to merge.
type Bound struct {
	Plan    *Plan
	Targets []Target
	// Merge is how to combine the targets' rows into the answer; nil when one target
	// answers alone or rows are simply concatenated (writes with RETURNING).
	Merge *MergeSpec
	// Limit and Offset are the values of the statement's LIMIT and OFFSET when Merge
	// applies them (-1: none).
	Limit, Offset int64
	// Broadcast is set when the targets are copies of one table (a write to a
	// broadcast table): the first target's answer is the client's answer.
	Broadcast bool
	// Destination is the routing answer, for explaining.
	Destination routing.Destination
	// Refused is set when the coordinator database answers (Coordinated): why the
	// merge could not.
	Refused error
	// AsWritten is, when the coordinator database answers, the statement as the
	// client wrote it (the target may run it rewritten: Options.ShardAggregates), for
	// one database to analyse when the coordinator fails.
	AsWritten string
	// sql and lits are the statement's text and literals (DescribeSQL).
	sql  string
	lits []Literal
	// Keys are the keys drawn for the statement's rows (Plan.Keys), for explaining.
	Keys []string

	one     [1]Target // storage for the usual single target
	oneNode [1]int
}

// MultiTarget reports whether the bound statement runs on more than one target.
func (b *Bound) MultiTarget() bool { return len(b.Targets) > 1 }

// Explain describes where and how a bound statement runs: the routing answer, one line
// per target (data source, shard, the SQL it runs) and the merge. The wire proxy's
// route preview and the driver show it.
func (b *Bound) Explain() string {
	var sb strings.Builder
	dss := b.Plan.rules.DataSources()
	fmt.Fprintf(&sb, "%s", b.Plan.Kind)
	if len(b.Plan.Tables) > 0 {
		fmt.Fprintf(&sb, " of %s", strings.Join(b.Plan.Tables, ", "))
	}
	if b.Destination != nil {
		fmt.Fprintf(&sb, " -> %s", b.Destination)
	}
	fmt.Fprintf(&sb, " (%d target", len(b.Targets))
	if len(b.Targets) != 1 {
		sb.WriteByte('s')
	}
	sb.WriteString(")\n")
	for _, t := range b.Targets {
		name := fmt.Sprint(t.DataSource)
		if t.DataSource >= 0 && t.DataSource < len(dss) {
			name = dss[t.DataSource].Name
		}
		if t.DataSource == len(dss) {
			name = "coordinator"
		}
		where := "data source " + name
		if t.Shard >= 0 {
			where = fmt.Sprintf("%s shard %d", name, t.Shard)
		}
		fmt.Fprintf(&sb, "  %s: %s\n", where, t.SQL)
	}
	switch {
	case b.Coordinated() && b.Targets[0].SQL != b.AsWritten:
		fmt.Fprintf(&sb, "  merge: none, each shard aggregates its own rows where the rewrite is exact, and the coordinator database combines one row per group per shard and evaluates the rest (the merge cannot: %s)\n", refusalText(b.Refused))
	case b.Coordinated():
		fmt.Fprintf(&sb, "  merge: none, the coordinator database evaluates the statement over every shard's rows (the merge cannot: %s)\n", refusalText(b.Refused))
	case b.Merge != nil:
		fmt.Fprintf(&sb, "  merge: %s", b.Merge)
		if b.Limit >= 0 || b.Offset >= 0 {
			fmt.Fprintf(&sb, " (limit %d, offset %d)", b.Limit, max(b.Offset, 0))
		}
		sb.WriteByte('\n')
	case b.Broadcast:
		sb.WriteString("  merge: none, every copy of the table runs the write; the first answers\n")
	case len(b.Targets) > 1:
		sb.WriteString("  merge: concatenate rows, add up row counts\n")
	}
	return sb.String()
}

// Memo returns the value stored on the plan under key, computing it with make the first
// time. Drivers keep what they learn about a statement (its described parameter types,
// say) with its plan, so that it goes when the plan leaves the cache.
func (p *Plan) Memo(key any, make func() (any, error)) (any, error) {
	if v, ok := p.memo.Load(key); ok {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return nil, err
	}
	actual, _ := p.memo.LoadOrStore(key, v)
	return actual, nil
}
