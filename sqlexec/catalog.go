package sqlexec

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// Catalog reads what the sharding rules leave out from the shards' own catalogs: the
// types and order of columns, which functions are aggregates, and whether text compares
// byte by byte. Answers are cached until Invalidate (call it after DDL).
type Catalog struct {
	rules *rules.Compiled
	pool  Pool

	mu struct {
		sync.Mutex
		keyTypes  map[string]rules.KeyType // "table.column"
		columns   map[string][]string
		aggs      map[string]bool // nil until read
		overloads *bool           // nil until read
		dbOrder   map[int]orderAnswer
		tblOrder  map[string]orderAnswer // "ds/table"
	}
}

type orderAnswer struct {
	byteOrder bool   // no text column compares other than by bytes
	own       bool   // some text column has a collation of its own (not the default)
	collation string // the collation that does not compare by bytes
}

var _ sqlplan.Catalog = (*Catalog)(nil)

// catalogPoolKey carries, in a context, the pool a transaction's catalog lookups go
// through (see WithCatalogPool).
type catalogPoolKey struct{}

// WithCatalogPool makes the catalog's lookups under ctx go through pool, uncached: a
// transaction that ran DDL reads its own schema, which it has not committed and no
// other session can see, through its own connections (the statements of a migration
// sent as one string, CREATE TABLE then INSERT, plan on the table the first made).
func WithCatalogPool(ctx context.Context, pool Pool) context.Context {
	return context.WithValue(ctx, catalogPoolKey{}, pool)
}

// source returns the pool lookups under ctx go through, and whether their answers are
// private to a transaction (neither read from nor kept in the cache).
func (c *Catalog) source(ctx context.Context) (Pool, bool) {
	if p, ok := ctx.Value(catalogPoolKey{}).(Pool); ok && p != nil {
		return p, true
	}
	return c.pool, false
}

// TransactionPool lends a transaction's connections as a Pool, for
// WithCatalogPool: a lookup on data source ds runs through conns (joining ds to the
// transaction, as any of its statements would).
func TransactionPool(conns Conns) Pool { return txPool{conns} }

type txPool struct{ conns Conns }

func (p txPool) Acquire(_ context.Context, ds int) (Lease, error) {
	return txLease{conns: p.conns, ds: ds}, nil
}

// txLease gives its connection back when Run returns: it lends a catalog lookup a
// connection, and must not back a Session (see Lease).
type txLease struct {
	conns Conns
	ds    int
}

func (l txLease) Run(ctx context.Context, fn func(*pgconn.PgConn) error) error {
	err := l.conns.Run(ctx, l.ds, fn)
	l.conns.Release(l.ds, err)
	return err
}

func (l txLease) Release(bool) {}

// NewCatalog returns a catalog reading the data sources of r through pool.
func NewCatalog(r *rules.Compiled, pool Pool) *Catalog {
	c := &Catalog{rules: r, pool: pool}
	c.Invalidate()
	return c
}

// Invalidate forgets every cached answer.
func (c *Catalog) Invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.keyTypes = map[string]rules.KeyType{}
	c.mu.columns = map[string][]string{}
	c.mu.aggs = nil
	c.mu.overloads = nil
	c.mu.dbOrder = map[int]orderAnswer{}
	c.mu.tblOrder = map[string]orderAnswer{}
}

// query runs sql on data source ds and returns its rows as text.
func (c *Catalog) query(ctx context.Context, ds int, sql string, args ...string) ([][]*string, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	var rows [][]*string
	pool, _ := c.source(ctx)
	err := withConn(ctx, pool, ds, func(conn *pgconn.PgConn) error {
		rr := conn.ExecParams(ctx, sql, params, nil, nil, nil)
		for rr.NextRow() {
			var row []*string
			for _, v := range rr.Values() {
				if v == nil {
					row = append(row, nil)
					continue
				}
				s := string(v)
				row = append(row, &s)
			}
			rows = append(rows, row)
		}
		_, err := rr.Close()
		return err
	})
	return rows, err
}

// KeyType implements sqlplan.Catalog: the type of a sharding column, read on the data
// source holding the table's first shard.
func (c *Catalog) KeyType(ctx context.Context, t *rules.TableRule, column string) (rules.KeyType, error) {
	k := t.Name + "." + column
	_, private := c.source(ctx)
	c.mu.Lock()
	typ, ok := c.mu.keyTypes[k]
	c.mu.Unlock()
	if ok && !private {
		return typ, nil
	}
	node := t.Nodes[0]
	rows, err := c.query(ctx, node.DataSource,
		`SELECT c.oid::text, format_type(a.atttypid, NULL)
		   FROM (SELECT to_regclass($1) AS oid) c
		   LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped`,
		nodeName(node), column)
	if err != nil {
		return "", err
	}
	if len(rows) == 0 || rows[0][0] == nil {
		return "", pgErr(sqlplan.CodeUndefinedTable, "relation %q does not exist", t.Name)
	}
	if rows[0][1] == nil {
		return "", pgErr(sqlplan.CodeUndefinedColumn, "column %q of relation %q does not exist (it is the table's sharding column)", column, t.Name)
	}
	typ, err = rules.ParseKeyType(*rows[0][1])
	if err != nil {
		return "", unsupported("sharding column %s.%s: %v", t.Name, column, err)
	}
	if !private {
		c.mu.Lock()
		c.mu.keyTypes[k] = typ
		c.mu.Unlock()
	}
	return typ, nil
}

// keySequenceSQL finds, for the table table (an SQL expression of its regclass) and
// column $2: the sequence the column's default draws from (an identity's, or the one
// sequence a default of exactly nextval('...'::regclass) names), by OID and by name
// (schema-qualified, quoted); whether the column is GENERATED ALWAYS; whether another
// column of the table is; the table's OID; and the default's stored expression tree
// ("" for an identity). No backslash, and identifiers may come
// quoted: it reads the same whatever standard_conforming_strings and
// quote_all_identifiers say on the session that runs it.
func keySequenceSQL(table string) string {
	return `SELECT s.oid::text AS seq_oid, pg_catalog.format('%I.%I', n.nspname, s.relname) AS seq,
	        a.attidentity = 'a' AS always,
	        EXISTS (SELECT FROM pg_catalog.pg_attribute o WHERE o.attrelid = a.attrelid AND o.attnum > 0
	                   AND o.attnum <> a.attnum AND NOT o.attisdropped AND o.attidentity = 'a') AS other_always,
	        a.attrelid::text AS table_oid,
	        coalesce((SELECT d.adbin::text FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum), '') AS default_tree
	   FROM pg_catalog.pg_attribute a
	   JOIN pg_catalog.pg_class s ON s.relkind = 'S' AND s.oid = CASE
	        WHEN a.attidentity <> '' THEN
	          (SELECT dep.objid FROM pg_catalog.pg_depend dep
	            WHERE dep.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND dep.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
	              AND dep.refobjid = a.attrelid AND dep.refobjsubid = a.attnum AND dep.deptype = 'i')
	        ELSE
	          (SELECT dep.refobjid FROM pg_catalog.pg_attrdef d
	             JOIN pg_catalog.pg_depend dep ON dep.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass
	              AND dep.objid = d.oid AND dep.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
	              AND dep.deptype = 'n' AND dep.refobjid <> d.adrelid
	            WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum
	              AND pg_catalog.pg_get_expr(d.adbin, d.adrelid) ~ '^"?nextval"?[(]''[^'']*''::"?regclass"?[)]$')
	        END
	   JOIN pg_catalog.pg_namespace n ON n.oid = s.relnamespace
	  WHERE a.attrelid = ` + table + ` AND a.attname = $2 AND NOT a.attisdropped`
}

// KeySequence implements the planner's key sequences (sqlplan.KeyDefault), read on the
// data source of the table's first shard.
func (c *Catalog) KeySequence(ctx context.Context, t *rules.TableRule, column string) (sqlplan.KeyDefault, error) {
	k := "keyseq " + t.Name + "." + column // not a table name: it has a blank
	_, private := c.source(ctx)
	c.mu.Lock()
	ans, ok := c.mu.columns[k]
	c.mu.Unlock()
	if !ok || private {
		rows, err := c.query(ctx, t.Nodes[0].DataSource, keySequenceSQL("pg_catalog.to_regclass($1)"), nodeName(t.Nodes[0]), column)
		if err != nil {
			return sqlplan.KeyDefault{}, err
		}
		ans = []string{"", "", "f", "f", "", ""}
		if len(rows) == 1 {
			ans = []string{*rows[0][0], *rows[0][1], *rows[0][2], *rows[0][3], *rows[0][4], *rows[0][5]}
		}
		if !private {
			c.mu.Lock()
			c.mu.columns[k] = ans
			c.mu.Unlock()
		}
	}
	return sqlplan.KeyDefault{SequenceOID: ans[0], Sequence: ans[1], Always: ans[2] == "t", OtherAlways: ans[3] == "t", TableOID: ans[4], DefaultTree: ans[5]}, nil
}

// Columns implements sqlplan.Catalog.
func (c *Catalog) Columns(ctx context.Context, t *rules.TableRule) ([]string, error) {
	return c.columns(ctx, t, false)
}

// FloatColumns returns the columns of a table whose values are or hold floating-point
// numbers (real, double precision, a domain over them, an array of them, a geometric
// type, and any composite type): their sums depend on the order of addition.
func (c *Catalog) FloatColumns(ctx context.Context, t *rules.TableRule) ([]string, error) {
	return c.cachedColumns(ctx, "float "+t.Name, t, // not a table name: it has a blank
		`SELECT a.attname FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
		  WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		    AND (a.atttypid IN (700, 701) OR ty.typbasetype IN (700, 701) OR ty.typelem IN (700, 701)
		         OR ty.typcategory = 'G' OR ty.typtype = 'c')`, false)
}

// ColumnTypes returns each column of a table with its type as format_type writes it,
// modifier included (numeric(12,2)).
func (c *Catalog) ColumnTypes(ctx context.Context, t *rules.TableRule) (map[string]string, error) {
	pairs, err := c.cachedColumns(ctx, "types "+t.Name, t, // not a table name: it has a blank
		`SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
		  WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, true)
	if err != nil {
		return nil, err
	}
	types := make(map[string]string, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		types[pairs[i]] = pairs[i+1]
	}
	return types, nil
}

// ShardStats returns what PostgreSQL's statistics say of a sharded table's first
// physical table: its rows, and the distinct values of each column its statistics
// cover. rows is 0 where the table was never analyzed. Nothing is cached here: a plan
// keeps what was read when it was made.
func (c *Catalog) ShardStats(ctx context.Context, t *rules.TableRule) (rows float64, distinct map[string]float64, err error) {
	res, err := c.query(ctx, t.Nodes[0].DataSource,
		`SELECT c.reltuples::float8::text, s.attname::text, s.n_distinct::text
		   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		   LEFT JOIN pg_catalog.pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND NOT s.inherited
		  WHERE c.oid = to_regclass($1)`, nodeName(t.Nodes[0]))
	if err != nil || len(res) == 0 {
		return 0, nil, err
	}
	if rows, err = strconv.ParseFloat(*res[0][0], 64); err != nil || rows <= 0 {
		return 0, nil, err
	}
	distinct = map[string]float64{}
	for _, r := range res {
		if r[1] == nil || r[2] == nil {
			continue
		}
		d, err := strconv.ParseFloat(*r[2], 64)
		if err != nil {
			return 0, nil, err
		}
		if d < 0 {
			d = -d * rows // a share of the rows
		}
		distinct[*r[1]] = d
	}
	return rows, distinct, nil
}

// CopyColumns returns the columns COPY without a column list takes: every column but
// the generated ones, in order.
func (c *Catalog) CopyColumns(ctx context.Context, t *rules.TableRule) ([]string, error) {
	return c.columns(ctx, t, true)
}

func (c *Catalog) columns(ctx context.Context, t *rules.TableRule, forCopy bool) ([]string, error) {
	key, generated := t.Name, "false"
	if forCopy {
		key, generated = "copy "+key, "true" // not a table name: it has a blank
	}
	return c.cachedColumns(ctx, key, t,
		`SELECT a.attname FROM pg_catalog.pg_attribute a
		  WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND ($2 = false OR a.attgenerated = '')
		  ORDER BY a.attnum`, true, generated)
}

// cachedColumns returns the values query lists for table t's first physical table ($1),
// row after row, cached under key. must says that the table must exist (42P01
// otherwise).
func (c *Catalog) cachedColumns(ctx context.Context, key string, t *rules.TableRule, query string, must bool, args ...string) ([]string, error) {
	_, private := c.source(ctx)
	c.mu.Lock()
	cols, ok := c.mu.columns[key]
	c.mu.Unlock()
	if ok && !private {
		return cols, nil
	}
	node := t.Nodes[0]
	rows, err := c.query(ctx, node.DataSource, query, append([]string{nodeName(node)}, args...)...)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 && must {
		return nil, pgErr(sqlplan.CodeUndefinedTable, "relation %q does not exist", t.Name)
	}
	cols = []string{}
	for _, r := range rows {
		for _, v := range r {
			cols = append(cols, *v)
		}
	}
	if !private {
		c.mu.Lock()
		c.mu.columns[key] = cols
		c.mu.Unlock()
	}
	return cols, nil
}

// IsAggregate implements sqlplan.Catalog, from the default data source's pg_proc.
func (c *Catalog) IsAggregate(ctx context.Context, name string) (bool, error) {
	_, private := c.source(ctx)
	c.mu.Lock()
	aggs := c.mu.aggs
	c.mu.Unlock()
	if aggs == nil || private {
		rows, err := c.query(ctx, c.rules.DefaultDataSource(), `SELECT DISTINCT proname::text FROM pg_catalog.pg_proc WHERE prokind = 'a'`)
		if err != nil {
			return false, err
		}
		aggs = map[string]bool{}
		for _, r := range rows {
			aggs[*r[0]] = true
		}
		if !private {
			c.mu.Lock()
			c.mu.aggs = aggs
			c.mu.Unlock()
		}
	}
	return aggs[name], nil
}

// UserOverloads reports whether the default data source's database defines operators
// or casts of its own, or functions named as one of PostgreSQL's, beyond those
// PostgreSQL creates with it (object ids from FirstNormalObjectId, 16384, on;
// extensions' too): an unqualified call could then reach the user's.
func (c *Catalog) UserOverloads(ctx context.Context) (bool, error) {
	_, private := c.source(ctx)
	c.mu.Lock()
	known := c.mu.overloads
	c.mu.Unlock()
	if known != nil && !private {
		return *known, nil
	}
	rows, err := c.query(ctx, c.rules.DefaultDataSource(), `SELECT (EXISTS (SELECT FROM pg_catalog.pg_operator WHERE oid >= 16384)
		OR EXISTS (SELECT FROM pg_catalog.pg_cast WHERE oid >= 16384)
		OR EXISTS (SELECT FROM pg_catalog.pg_proc u WHERE u.oid >= 16384
			AND EXISTS (SELECT FROM pg_catalog.pg_proc b WHERE b.oid < 16384 AND b.proname = u.proname)))::text`)
	if err != nil {
		return false, err
	}
	user := len(rows) != 1 || rows[0][0] == nil || *rows[0][0] != "false"
	if !private {
		c.mu.Lock()
		c.mu.overloads = &user
		c.mu.Unlock()
	}
	return user, nil
}

// byteOrderCollation reports whether a collation (by name or locale) orders text as
// its bytes: C and POSIX, and glibc's C.UTF-8, which orders by code point (UTF-8's
// byte order).
func byteOrderCollation(name string) bool {
	switch strings.ToLower(name) {
	case "c", "posix", "c.utf-8", "c.utf8", "ucs_basic":
		return true
	}
	return false
}

// TextOrder says how text of tables compares on data source ds. byteOrder is true when
// every text column and the database's default collation compare byte by byte (text can
// be merged as bytes). Otherwise, when every text column uses the database's default
// collation, collation is "default": the server can rank the values. Otherwise (some
// column has a collation of its own that is not byte order) collation is that
// collation's name and uniform is false.
func (c *Catalog) TextOrder(ctx context.Context, ds int, tables []string) (byteOrder, uniform bool, collation string, err error) {
	_, private := c.source(ctx)
	c.mu.Lock()
	db, ok := c.mu.dbOrder[ds]
	c.mu.Unlock()
	if !ok || private {
		rows, err := c.query(ctx, ds, `SELECT datlocprovider::text, datcollate, coalesce(daticulocale, '')
		                                 FROM pg_catalog.pg_database WHERE datname = current_database()`)
		if err != nil {
			return false, false, "", err
		}
		if len(rows) == 1 {
			provider, collate, icu := *rows[0][0], *rows[0][1], *rows[0][2]
			db = orderAnswer{byteOrder: provider == "c" && byteOrderCollation(collate), collation: collate}
			if provider == "i" {
				db.collation = icu
			}
		}
		if !private {
			c.mu.Lock()
			c.mu.dbOrder[ds] = db
			c.mu.Unlock()
		}
	}
	for _, t := range tables {
		key := strconv.Itoa(ds) + "/" + t
		c.mu.Lock()
		ans, ok := c.mu.tblOrder[key]
		c.mu.Unlock()
		if !ok || private {
			var names []string
			for _, n := range c.rules.Lookup(t).Nodes {
				if n.DataSource == ds {
					names = append(names, nodeName(n))
				}
			}
			ans = orderAnswer{byteOrder: true}
			if len(names) > 0 {
				rows, err := c.query(ctx, ds,
					`SELECT co.collname::text, co.collprovider::text, co.collcollate
					   FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
					  WHERE a.attrelid IN (SELECT to_regclass(x) FROM unnest($1::text[]) x)
					    AND a.attnum > 0 AND NOT a.attisdropped AND a.attcollation NOT IN (0, 100)`,
					"{"+strings.Join(quoteArray(names), ",")+"}")
				if err != nil {
					return false, false, "", err
				}
				for _, r := range rows {
					name, provider, collate := *r[0], *r[1], ""
					if r[2] != nil {
						collate = *r[2]
					}
					ans.own = true
					if !(byteOrderCollation(name) || (provider == "c" && byteOrderCollation(collate))) {
						ans = orderAnswer{collation: name, own: true}
						break
					}
				}
			}
			if !private {
				c.mu.Lock()
				c.mu.tblOrder[key] = ans
				c.mu.Unlock()
			}
		}
		if !ans.byteOrder {
			// A column with a collation of its own: the ranks of the default one would
			// not do, and a sort key's collation is not known here.
			return false, false, ans.collation, nil
		}
		if ans.own && !db.byteOrder {
			// Columns in "C" beside columns in a default that is not: ranking every key
			// under the default would misorder the "C" ones.
			return false, false, db.collation + " and C", nil
		}
	}
	if db.byteOrder {
		return true, true, "", nil
	}
	return false, true, "default", nil
}

// OwnCollation reports whether a column of any of tables (logical names; a table
// without rules is the default data source's) has a collation of its own, not its
// type's default, or is of a domain with a collation other than the database's
// default (a value read as its base type would not carry it): a value read from it
// may carry that collation into a comparison.
func (c *Catalog) OwnCollation(ctx context.Context, tables []string) (bool, error) {
	return c.anyColumn(ctx, tables, `a.attcollation <> ty.typcollation OR ty.typtype = 'd' AND ty.typcollation NOT IN (0, 100)`)
}

// Domains reports whether a column of any of tables is of a domain: a value read from
// it arrives as its base type's.
func (c *Catalog) Domains(ctx context.Context, tables []string) (bool, error) {
	return c.anyColumn(ctx, tables, `ty.typtype = 'd'`)
}

// anyColumn reports whether a column of any of tables (logical names; a table without
// rules is the default data source's), read on the data source of its first physical
// table, meets cond, a condition over its pg_attribute a and pg_type ty.
func (c *Catalog) anyColumn(ctx context.Context, tables []string, cond string) (bool, error) {
	for _, t := range tables {
		ds, name := c.rules.DefaultDataSource(), pgx.Identifier{t}.Sanitize()
		if r := c.rules.Lookup(t); r != nil && len(r.Nodes) > 0 {
			ds, name = r.Nodes[0].DataSource, nodeName(r.Nodes[0])
		}
		rows, err := c.query(ctx, ds, `SELECT count(*)::text FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
		                                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND (`+cond+`)`, name)
		if err != nil {
			return false, err
		}
		if len(rows) == 1 && rows[0][0] != nil && *rows[0][0] != "0" {
			return true, nil
		}
	}
	return false, nil
}

// quoteArray quotes elements for a text[] literal.
func quoteArray(items []string) []string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
	}
	return out
}

// nodeName names a physical table for to_regclass, schema-qualified when it has one.
func nodeName(n rules.Node) string {
	if n.Schema != "" {
		return pgx.Identifier{n.Schema, n.Table}.Sanitize()
	}
	return pgx.Identifier{n.Table}.Sanitize()
}
