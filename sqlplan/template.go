package sqlplan

import (
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/rules"
)

// A template is rewritten SQL with holes: the physical name of each table reference,
// each parameter (renumbered per target, so that a target sends only the parameters
// its statement uses), each literal of a normalised statement, and computed values
// (the LIMIT pushed to each shard). It is made once per plan, by renaming tables to
// markers in the parse tree, deparsing, and cutting the text at the markers; rendering
// it for a target is string concatenation.

// markerPrefix starts the identifiers that stand for table references in deparsed SQL.
const markerPrefix = "__sl_t"

// slotBase numbers the parameters that stand for computed values: $1000000 and up.
const slotBase = 1_000_000

// Computed slots.
const (
	slotLimit = iota // LIMIT offset+limit, pushed to each shard
	// slotKeys+i is the i-th key drawn from a sequence for an INSERT (Plan.Keys).
	slotKeys
)

// slotParam returns the first parameter number a statement names at slotBase or
// above, or 0: no client may write one (PostgreSQL has no such parameter).
func slotParam(tree *pg.ParseResult) int {
	n := 0
	walk(tree, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok && int(p.Number) >= slotBase && n == 0 {
			n = int(p.Number)
		}
		return n == 0
	})
	return n
}

// describeSlot fills computed slots in a statement described without values: no LIMIT,
// and the column's default for a key the sequence would give.
func describeSlot(n int) string {
	if n >= slotKeys {
		return "DEFAULT"
	}
	return "ALL"
}

type segKind uint8

const (
	segText segKind = iota
	segParam
	segLiteral
	segTable
	segSlot
)

type segment struct {
	kind segKind
	text string
	n    int // parameter or literal number (1-based), table reference index, or slot
}

type template struct {
	segs []segment
	// static is set when the text depends only on where the tables are placed (no
	// literal or computed slot): its renderings are then kept in rendered.
	static   bool
	rendered sync.Map // renderKey -> *rendering
}

// renderKey identifies a rendering of a static template: the one group of sharded
// tables placed and its node (nil and -1 for none).
type renderKey struct {
	g    *group
	node int
}

type rendering struct {
	sql    string
	params []int
}

// markTables renames every table reference in the parse tree to its marker, adding an
// alias with the logical name where there was none so that column references such as
// t_order.id keep working against t_order_0.
func (a *analyzer) markTables() {
	for _, r := range a.plan.refs {
		rv := r.rangeVar
		if rv == nil {
			continue
		}
		if rv.Alias == nil && !r.inDDL && renamed(r) && a.mayReferTo(rv, rv.Relname) {
			rv.Alias = &pg.Alias{Aliasname: rv.Relname}
		}
		rv.Relname = markerPrefix + strconv.Itoa(r.index)
		if r.rule.Nodes[0].Schema != "" {
			rv.Schemaname = "" // the marker becomes a schema-qualified name
		}
	}
}

// mayReferTo reports whether a column reference may refer to the table rv references
// by name: a column qualified with it anywhere in the statement (t_order.id), or,
// unless rv is the table a statement writes, an unqualified one, which may be the
// table's whole row (row_to_json(t_order)). A renamed table keeps its logical name as
// an alias only then, so that most statements go out without an alias (which SQLite's
// UPDATE and DELETE only take with AS, where a written table's column often has the
// table's name).
func (a *analyzer) mayReferTo(rv *pg.RangeVar, name string) bool {
	if a.quals == nil {
		a.quals, a.bare, a.written = map[string]bool{}, map[string]bool{}, map[*pg.RangeVar]bool{}
		walk(a.tree, func(m proto.Message) bool {
			switch n := m.(type) {
			case *pg.ColumnRef:
				if len(n.Fields) == 1 {
					if s := n.Fields[0].GetString_(); s != nil {
						a.bare[s.Sval] = true
					}
				} else if s := n.Fields[len(n.Fields)-2].GetString_(); s != nil {
					a.quals[s.Sval] = true
				}
			case *pg.UpdateStmt:
				a.written[n.Relation] = true
			case *pg.DeleteStmt:
				a.written[n.Relation] = true
			case *pg.InsertStmt:
				a.written[n.Relation] = true
			}
			return true
		})
	}
	return a.quals[name] || a.bare[name] && !a.written[rv]
}

// renamed reports whether a reference has another physical name on some shard.
func renamed(r *tableRef) bool {
	for _, n := range r.rule.Nodes {
		if n.Table != r.name || n.Schema != "" {
			return true
		}
	}
	return false
}

// needsRename reports whether some reference's physical name differs from its logical
// name on some target, so that the client's text cannot be sent as it is.
func (a *analyzer) needsRename() bool {
	for _, r := range a.plan.refs {
		if renamed(r) {
			return true
		}
	}
	return false
}

// singleTemplate sets the template a statement runs with on one target: none when the
// client's text can go as it is.
func (a *analyzer) singleTemplate(stmt *pg.Node) error {
	if !a.needsRename() {
		return nil
	}
	t, err := a.makeTemplate(stmt)
	if err != nil {
		return err
	}
	a.plan.tmpl = t
	return nil
}

// makeTemplate deparses a (marked) statement and cuts it into segments.
func (a *analyzer) makeTemplate(stmt *pg.Node) (*template, error) {
	text, err := deparse(a.tree.Version, stmt)
	if err != nil {
		return nil, err
	}
	return a.cut(text), nil
}

// cut splits deparsed text at markers and parameters.
func (a *analyzer) cut(text string) *template {
	t := &template{}
	l := lexer{s: text}
	last := 0
	flush := func(upto int) {
		if upto > last {
			t.segs = append(t.segs, segment{kind: segText, text: text[last:upto]})
		}
	}
	for {
		tok := l.next()
		if tok.kind == tokEOF {
			break
		}
		word := text[tok.start:tok.end]
		switch {
		case tok.kind == tokIdent && strings.HasPrefix(word, markerPrefix):
			i, err := strconv.Atoi(word[len(markerPrefix):])
			if err != nil {
				continue
			}
			flush(tok.start)
			t.segs = append(t.segs, segment{kind: segTable, n: i})
			last = tok.end
		case tok.kind == tokParam:
			n, _ := strconv.Atoi(word[1:])
			flush(tok.start)
			switch {
			case n >= slotBase:
				t.segs = append(t.segs, segment{kind: segSlot, n: n - slotBase})
			case a.normalized:
				t.segs = append(t.segs, segment{kind: segLiteral, n: n})
			default:
				t.segs = append(t.segs, segment{kind: segParam, n: n})
			}
			last = tok.end
		}
	}
	flush(len(text))
	t.static = true
	for _, s := range t.segs {
		if s.kind == segLiteral || s.kind == segSlot {
			t.static = false
		}
	}
	return t
}

// renderer fills a template's holes for one target.
type renderer struct {
	sql     string               // the client's text, for literals
	lits    []Literal            // the client's literals
	table   func(ref int) string // the reference's name as SQL (quoted, qualified)
	slot    func(n int) string
	params  []int // collected: target parameter i+1 is client parameter params[i]
	renumOf map[int]int
	// keepParams writes $n as the client wrote it (for describing a statement).
	keepParams bool
}

func (r *renderer) render(t *template) string {
	var b strings.Builder
	for _, s := range t.segs {
		switch s.kind {
		case segText:
			b.WriteString(s.text)
		case segTable:
			b.WriteString(r.table(s.n))
		case segLiteral:
			l := r.lits[s.n-1]
			b.WriteString(r.sql[l.Start:l.End])
		case segSlot:
			b.WriteString(r.slot(s.n))
		case segParam:
			if r.keepParams {
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(s.n))
				continue
			}
			if r.renumOf == nil {
				r.renumOf = map[int]int{}
			}
			k, ok := r.renumOf[s.n]
			if !ok {
				r.params = append(r.params, s.n-1)
				k = len(r.params)
				r.renumOf[s.n] = k
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(k))
		}
	}
	return b.String()
}

// nodeSQL names a physical table in SQL: quoted when needed, and qualified with its
// schema when shards are schemas of one data source.
func nodeSQL(n rules.Node) string {
	if n.Schema != "" {
		return quoteIdent(n.Schema) + "." + quoteIdent(n.Table)
	}
	return quoteIdent(n.Table)
}

// quoteIdent quotes a physical table name unless it is a plain lower-case identifier
// that is not a keyword we know to be reserved.
func quoteIdent(name string) string {
	if plainIdent(name) && !reserved[name] {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

func plainIdent(s string) bool {
	if s == "" || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z')) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// reserved are PostgreSQL's reserved key words (and those reserved in table names),
// which a table name must quote.
var reserved = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization binary both
		case cast check collate collation column concurrently constraint create cross current_catalog current_date
		current_role current_schema current_time current_timestamp current_user default deferrable desc distinct do
		else end except false fetch for foreign freeze from full grant group having ilike in initially inner
		intersect into is isnull join lateral leading left like limit localtime localtimestamp natural not notnull
		null offset on only or order outer overlaps placing primary references returning right select
		session_user similar some symmetric system_user table tablesample then to trailing true union unique user
		using variadic verbose when where window with`) {
		reserved[w] = true
	}
}
