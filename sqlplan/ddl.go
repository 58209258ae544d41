package sqlplan

import (
	"fmt"
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
)

// ddlSpec holds the statements a DDL statement becomes, one per target, fixed at plan
// time (DDL is planned each time it runs, never cached).
type ddlSpec struct {
	targets []Target
}

func (pl *Plan) bindDDL(b *Bound, _ *values) error {
	b.Targets = append([]Target(nil), pl.ddl.targets...)
	b.Destination = routing.DestinationAll{}
	return nil
}

// isDDLNode reports whether a statement is planned as DDL (never normalised).
func isDDLNode(n *pg.Node) bool {
	switch n.Node.(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt,
		*pg.Node_ExplainStmt, *pg.Node_CopyStmt, *pg.Node_TransactionStmt, *pg.Node_VariableSetStmt,
		*pg.Node_VariableShowStmt, *pg.Node_DiscardStmt, *pg.Node_LockStmt:
		return false
	}
	return true
}

// allDataSources lists statement types that go to every data source as they are:
// objects that are not tables (schemas, functions, types, extensions, sequences,
// operators, languages, foreign servers, event triggers), roles and their rights, and
// CHECKPOINT.
func allDataSources(n *pg.Node) bool {
	switch n.Node.(type) {
	case *pg.Node_CreateSchemaStmt, *pg.Node_CreateFunctionStmt, *pg.Node_CreateExtensionStmt,
		*pg.Node_CreateSeqStmt, *pg.Node_AlterSeqStmt, *pg.Node_DefineStmt, *pg.Node_CompositeTypeStmt,
		*pg.Node_CreateEnumStmt, *pg.Node_AlterEnumStmt, *pg.Node_CreateDomainStmt, *pg.Node_AlterFunctionStmt,
		*pg.Node_AlterExtensionStmt, *pg.Node_CreateRangeStmt, *pg.Node_AlterDefaultPrivilegesStmt,
		*pg.Node_CreateCastStmt, *pg.Node_CreateOpClassStmt, *pg.Node_CreateOpFamilyStmt,
		*pg.Node_CreateConversionStmt, *pg.Node_CreateTransformStmt,
		*pg.Node_AlterDomainStmt, *pg.Node_AlterTypeStmt, *pg.Node_AlterCollationStmt, *pg.Node_AlterOperatorStmt,
		*pg.Node_AlterOpFamilyStmt, *pg.Node_AlterTsdictionaryStmt, *pg.Node_AlterTsconfigurationStmt,
		*pg.Node_CreatePlangStmt, *pg.Node_CreateAmStmt, *pg.Node_CreateEventTrigStmt, *pg.Node_AlterEventTrigStmt,
		*pg.Node_AlterExtensionContentsStmt, *pg.Node_AlterObjectDependsStmt, *pg.Node_CheckPointStmt,
		*pg.Node_CreateFdwStmt, *pg.Node_AlterFdwStmt, *pg.Node_CreateForeignServerStmt, *pg.Node_AlterForeignServerStmt,
		*pg.Node_CreateUserMappingStmt, *pg.Node_AlterUserMappingStmt, *pg.Node_DropUserMappingStmt,
		*pg.Node_AlterRoleSetStmt, *pg.Node_DropOwnedStmt, *pg.Node_ReassignOwnedStmt, *pg.Node_SecLabelStmt,
		*pg.Node_AlterPolicyStmt, *pg.Node_AlterStatsStmt:
		return true
	}
	return false
}

func (a *analyzer) analyzeDDL(stmt *pg.Node) error {
	a.plan.Kind, a.plan.Write = KindDDL, true
	a.plan.ddl = &ddlSpec{}
	if allDataSources(stmt) {
		a.everyDataSource(a.sql)
		return nil
	}
	switch n := stmt.Node.(type) {
	case *pg.Node_CreateStmt:
		return a.createTable(stmt, n.CreateStmt)
	case *pg.Node_IndexStmt:
		a.plan.NoTransaction = n.IndexStmt.Concurrent
		return a.createIndex(stmt, n.IndexStmt)
	case *pg.Node_AlterTableStmt:
		return a.alterTable(stmt, n.AlterTableStmt)
	case *pg.Node_RenameStmt:
		return a.rename(stmt, n.RenameStmt)
	case *pg.Node_DropStmt:
		a.plan.NoTransaction = n.DropStmt.Concurrent
		return a.drop(stmt, n.DropStmt)
	case *pg.Node_TruncateStmt:
		return a.perDataSource(stmt, n.TruncateStmt.Relations, "TRUNCATE")
	case *pg.Node_VacuumStmt:
		a.plan.NoTransaction = true
		var rels []*pg.Node
		for _, r := range n.VacuumStmt.Rels {
			rels = append(rels, &pg.Node{Node: &pg.Node_RangeVar{RangeVar: r.GetVacuumRelation().Relation}})
		}
		if len(rels) == 0 {
			a.everyDataSource(a.sql)
			return nil
		}
		return a.perDataSourceVacuum(stmt, n.VacuumStmt)
	case *pg.Node_ViewStmt:
		return a.createView(n.ViewStmt)
	case *pg.Node_CreateTableAsStmt:
		return a.createTableAs(n.CreateTableAsStmt)
	case *pg.Node_CommentStmt, *pg.Node_GrantStmt, *pg.Node_GrantRoleStmt, *pg.Node_CreateRoleStmt,
		*pg.Node_AlterRoleStmt, *pg.Node_DropRoleStmt, *pg.Node_CreatePolicyStmt, *pg.Node_AlterOwnerStmt,
		*pg.Node_AlterObjectSchemaStmt, *pg.Node_CreateTrigStmt, *pg.Node_RuleStmt, *pg.Node_CreateStatsStmt:
		a.everyDataSource(a.sql)
		return nil
	}
	if why, ok := refusedOverShards[strings.TrimSuffix(nodeType(stmt), "Stmt")]; ok {
		return unsupported("%s", why)
	}
	return unsupported("%s over several shards", statementName(stmt))
}

// everyDataSource sends sql as it is to every data source, in order.
func (a *analyzer) everyDataSource(sql string) {
	for d := range a.p.rules.NumDataSources() {
		a.plan.ddl.targets = append(a.plan.ddl.targets, Target{DataSource: d, Shard: -1, SQL: sql})
	}
}

// deparse prints a statement back as SQL.
func (a *analyzer) deparse(stmt *pg.Node) (string, error) {
	s, err := deparse(a.tree.Version, stmt)
	if err != nil {
		return "", err
	}
	return s, nil
}

// ddlRef registers a table named in DDL.
func (a *analyzer) ddlRef(rv *pg.RangeVar) (*tableRef, error) {
	r, err := a.addRefNoCatalog(rv)
	if err != nil {
		return nil, err
	}
	r.inDDL = true
	return r, nil
}

// addRefNoCatalog registers a reference without reading key types from the catalog
// (the table may not exist yet).
func (a *analyzer) addRefNoCatalog(rv *pg.RangeVar) (*tableRef, error) {
	r := &tableRef{rule: a.p.rules.Lookup(rv.Relname), name: rv.Relname, schema: rv.Schemaname, index: len(a.plan.refs), rangeVar: rv}
	a.plan.refs = append(a.plan.refs, r)
	a.plan.Tables = appendUnique(a.plan.Tables, r.name)
	return r, nil
}

// perNode sends the statement once per physical table of ref: renamed (rv, the
// statement's reference to the table, names the physical table, qualified with its
// schema when shards are schemas of one data source) when the physical name differs,
// on the data source that holds it. A broadcast table gets it on every data source; a
// default table on the default one. also, when given, renames what else the physical
// table needs (node -1: back to the logical name).
func (a *analyzer) perNode(stmt *pg.Node, ref *tableRef, rv *pg.RangeVar, also func(phys string, node int)) error {
	return a.perNodeRenaming(stmt, ref, rv, also, false)
}

// perNodeRenaming is perNode; with force, every physical table's statement is printed
// with also's renames, even where the table keeps its name (a foreign key's referenced
// table renamed on its shard).
func (a *analyzer) perNodeRenaming(stmt *pg.Node, ref *tableRef, rv *pg.RangeVar, also func(phys string, node int), force bool) error {
	for i, n := range ref.rule.Nodes {
		sql := a.sql
		if n.Table != ref.name || n.Schema != "" || force {
			relname, schema := rv.Relname, rv.Schemaname
			rv.Relname = n.Table
			if n.Schema != "" {
				rv.Schemaname = n.Schema
			}
			if also != nil {
				also(n.Table, i)
			}
			s, err := a.deparse(stmt)
			rv.Relname, rv.Schemaname = relname, schema
			if also != nil {
				also(ref.name, -1)
			}
			if err != nil {
				return err
			}
			sql = s
		}
		shard := -1
		if ref.sharded() {
			shard = i
		}
		a.plan.ddl.targets = append(a.plan.ddl.targets, Target{DataSource: n.DataSource, Shard: shard, SQL: sql})
	}
	return nil
}

func (a *analyzer) createTable(stmt *pg.Node, c *pg.CreateStmt) error {
	ref, err := a.ddlRef(c.Relation)
	if err != nil {
		return err
	}
	if ref.sharded() {
		if c.Partbound != nil || len(c.InhRelations) > 0 {
			return unsupported("a sharded table %s that is a partition or inherits", ref.name)
		}
		keys := ref.rule.KeyColumns()
		check := func(con *pg.Constraint, column string) error {
			switch con.Contype {
			case pg.ConstrType_CONSTR_PRIMARY, pg.ConstrType_CONSTR_UNIQUE:
				cols := []string{column}
				if column == "" {
					cols = nil
					for _, k := range con.Keys {
						cols = append(cols, k.GetString_().Sval)
					}
				}
				for _, k := range keys {
					if !slices.Contains(cols, k) {
						kind := "UNIQUE"
						if con.Contype == pg.ConstrType_CONSTR_PRIMARY {
							kind = "PRIMARY KEY"
						}
						return unsupported("a %s constraint on (%s) of sharded table %s without its sharding key %s: uniqueness cannot hold across shards", kind, strings.Join(cols, ", "), ref.name, k)
					}
				}
			case pg.ConstrType_CONSTR_EXCLUSION:
				return unsupported("an exclusion constraint on sharded table %s", ref.name)
			}
			return nil
		}
		for _, e := range c.TableElts {
			if cd := e.GetColumnDef(); cd != nil {
				for _, con := range cd.Constraints {
					if err := check(con.GetConstraint(), cd.Colname); err != nil {
						return err
					}
				}
			}
			if con := e.GetConstraint(); con != nil {
				if err := check(con, ""); err != nil {
					return err
				}
			}
		}
		for _, con := range c.Constraints {
			if err := check(con.GetConstraint(), ""); err != nil {
				return err
			}
		}
	}
	var fks []foreignKey
	for _, e := range c.TableElts {
		if cd := e.GetColumnDef(); cd != nil {
			for _, con := range cd.Constraints {
				fks = appendForeignKey(fks, con.GetConstraint(), cd.Colname)
			}
		}
		fks = appendForeignKey(fks, e.GetConstraint(), "")
	}
	for _, con := range c.Constraints {
		fks = appendForeignKey(fks, con.GetConstraint(), "")
	}
	return a.withForeignKeys(stmt, ref, c.Relation, fks)
}

// foreignKey is a FOREIGN KEY of a table's DDL: its columns (column, for one declared
// on a column) and the table and columns it references.
type foreignKey struct {
	con    *pg.Constraint
	column string
}

func appendForeignKey(fks []foreignKey, con *pg.Constraint, column string) []foreignKey {
	if con == nil || con.Contype != pg.ConstrType_CONSTR_FOREIGN || con.Pktable == nil {
		return fks
	}
	return append(fks, foreignKey{con, column})
}

// withForeignKeys sends a table's DDL once per physical table (perNode), each foreign
// key referencing the physical table on the same data source, and refuses a foreign key
// that no physical table can check: each physical table's rows must find every row they
// may reference in one physical table on their own data source. That is a broadcast
// table (a copy on every data source), a table that lives on the one data source every
// physical table of the referencing table is on, or a table sharded alike (same
// placement), referenced through the sharding key, shard by shard.
func (a *analyzer) withForeignKeys(stmt *pg.Node, ref *tableRef, rv *pg.RangeVar, fks []foreignKey) error {
	if len(fks) == 0 {
		return a.perNode(stmt, ref, rv, nil)
	}
	type target struct {
		pk           *pg.RangeVar
		name, schema string       // as the statement wrote them
		nodes        []rules.Node // per node of ref: the referenced physical table
	}
	var targets []target
	force := false
	for _, fk := range fks {
		pk := fk.con.Pktable
		pkRule := a.p.rules.Lookup(pk.Relname)
		refuse := func(why string) error {
			return unsupported("a foreign key from %s to %s: %s, so no one data source could check it", ref.name, pk.Relname, why)
		}
		t := target{pk: pk, name: pk.Relname, schema: pk.Schemaname}
		for _, n := range ref.rule.Nodes {
			var found *rules.Node
			switch {
			case pkRule.Kind == rules.KindBroadcast:
				for _, m := range pkRule.Nodes {
					if m.DataSource == n.DataSource {
						found = &m
						break
					}
				}
			case len(pkRule.Nodes) == 1:
				if pkRule.Nodes[0].DataSource == n.DataSource {
					found = &pkRule.Nodes[0]
				}
			}
			if found == nil {
				break
			}
			t.nodes = append(t.nodes, *found)
		}
		if len(t.nodes) != len(ref.rule.Nodes) {
			t.nodes = nil
			if pkRule.Kind != rules.KindSharded {
				return refuse(fmt.Sprintf("%s lives on data sources where %s does not", ref.name, pk.Relname))
			}
			if !rules.SamePlacement(ref.rule, pkRule) {
				return refuse(fmt.Sprintf("%s is sharded, and %s is not placed alike", pk.Relname, ref.name))
			}
			fkCols, pkCols := stringList(fk.con.FkAttrs), stringList(fk.con.PkAttrs)
			if fk.column != "" {
				fkCols = []string{fk.column}
			}
			refKeys, pkKeys := ref.rule.KeyColumns(), pkRule.KeyColumns()
			if len(pkCols) == 0 && len(fkCols) == 1 && len(pkKeys) == 1 {
				pkCols = pkKeys // the referenced primary key, which holds the sharding key
			}
			i := slices.Index(fkCols, refKeys[0])
			if len(refKeys) != 1 || len(pkKeys) != 1 || i < 0 || i >= len(pkCols) || pkCols[i] != pkKeys[0] {
				return refuse(fmt.Sprintf("it does not reference sharding key %s.%s with %s.%s", pk.Relname, pkKeys[0], ref.name, refKeys[0]))
			}
			t.nodes = pkRule.Nodes
		}
		for _, m := range t.nodes {
			if m.Table != pk.Relname || m.Schema != "" {
				force = true
			}
		}
		targets = append(targets, t)
	}
	return a.perNodeRenaming(stmt, ref, rv, func(_ string, node int) {
		for _, t := range targets {
			t.pk.Relname, t.pk.Schemaname = t.name, t.schema
			if node < 0 {
				continue
			}
			t.pk.Relname = t.nodes[node].Table
			if t.nodes[node].Schema != "" {
				t.pk.Schemaname = t.nodes[node].Schema
			}
		}
	}, force)
}

// stringList is the strings of a list of String nodes.
func stringList(list []*pg.Node) []string {
	var out []string
	for _, n := range list {
		out = append(out, n.GetString_().GetSval())
	}
	return out
}

func (a *analyzer) createIndex(stmt *pg.Node, ix *pg.IndexStmt) error {
	ref, err := a.ddlRef(ix.Relation)
	if err != nil {
		return err
	}
	if ref.sharded() && (ix.Unique || ix.Primary) {
		var cols []string
		for _, p := range ix.IndexParams {
			cols = append(cols, p.GetIndexElem().Name)
		}
		for _, k := range ref.rule.KeyColumns() {
			if !slices.Contains(cols, k) {
				return unsupported("a unique index on (%s) of sharded table %s without its sharding key %s: uniqueness cannot hold across shards", strings.Join(cols, ", "), ref.name, k)
			}
		}
	}
	name := ix.Idxname
	return a.perNode(stmt, ref, ix.Relation, func(phys string, node int) {
		// Index names are per schema: two physical tables in one database need two.
		if name != "" && node >= 0 {
			ix.Idxname = name + strings.TrimPrefix(phys, ref.name)
		} else {
			ix.Idxname = name
		}
	})
}

func (a *analyzer) alterTable(stmt *pg.Node, at *pg.AlterTableStmt) error {
	if at.Objtype != pg.ObjectType_OBJECT_TABLE {
		a.everyDataSource(a.sql)
		return nil
	}
	ref, err := a.ddlRef(at.Relation)
	if err != nil {
		return err
	}
	if ref.sharded() {
		keys := ref.rule.KeyColumns()
		for _, c := range at.Cmds {
			cmd := c.GetAlterTableCmd()
			var cons []*pg.Constraint
			column := ""
			if con := cmd.Def.GetConstraint(); con != nil {
				cons = append(cons, con)
			}
			if cd := cmd.Def.GetColumnDef(); cd != nil {
				column = cd.Colname
				for _, con := range cd.Constraints {
					cons = append(cons, con.GetConstraint())
				}
			}
			for _, con := range cons {
				if con.Contype != pg.ConstrType_CONSTR_PRIMARY && con.Contype != pg.ConstrType_CONSTR_UNIQUE {
					continue
				}
				cols := []string{column}
				if len(con.Keys) > 0 {
					cols = nil
					for _, k := range con.Keys {
						cols = append(cols, k.GetString_().Sval)
					}
				}
				for _, k := range keys {
					if !slices.Contains(cols, k) {
						return unsupported("a unique constraint on (%s) of sharded table %s without its sharding key %s: uniqueness cannot hold across shards", strings.Join(cols, ", "), ref.name, k)
					}
				}
			}
			if cmd.Subtype == pg.AlterTableType_AT_AlterColumnType || cmd.Subtype == pg.AlterTableType_AT_DropColumn {
				if slices.Contains(keys, cmd.Name) {
					return unsupported("changing or dropping sharding column %s.%s", ref.name, cmd.Name)
				}
			}
		}
	}
	var fks []foreignKey
	for _, c := range at.Cmds {
		cmd := c.GetAlterTableCmd()
		fks = appendForeignKey(fks, cmd.Def.GetConstraint(), "")
		if cd := cmd.Def.GetColumnDef(); cd != nil {
			for _, con := range cd.Constraints {
				fks = appendForeignKey(fks, con.GetConstraint(), cd.Colname)
			}
		}
	}
	return a.withForeignKeys(stmt, ref, at.Relation, fks)
}

func (a *analyzer) rename(stmt *pg.Node, rn *pg.RenameStmt) error {
	if rn.Relation == nil {
		a.everyDataSource(a.sql)
		return nil
	}
	ref, err := a.ddlRef(rn.Relation)
	if err != nil {
		return err
	}
	if ref.rule.Kind != rules.KindDefault {
		switch rn.RenameType {
		case pg.ObjectType_OBJECT_TABLE:
			return unsupported("renaming %s table %s: the sharding rules name it", ref.rule.Kind, ref.name)
		case pg.ObjectType_OBJECT_COLUMN:
			if slices.Contains(ref.rule.KeyColumns(), rn.Subname) {
				return unsupported("renaming sharding column %s.%s: the sharding rules name it", ref.name, rn.Subname)
			}
		}
	}
	return a.perNode(stmt, ref, rn.Relation, nil)
}

// drop handles DROP TABLE (each data source drops the physical tables it holds) and
// other DROPs (every data source).
func (a *analyzer) drop(stmt *pg.Node, d *pg.DropStmt) error {
	if d.RemoveType != pg.ObjectType_OBJECT_TABLE {
		a.everyDataSource(a.sql)
		return nil
	}
	perDS := map[int][]*pg.Node{}
	for _, obj := range d.Objects {
		parts := obj.GetList().Items
		name := parts[len(parts)-1].GetString_().Sval
		schema := ""
		if len(parts) > 1 {
			schema = parts[len(parts)-2].GetString_().Sval
		}
		rule := a.p.rules.Lookup(name)
		a.plan.Tables = appendUnique(a.plan.Tables, name)
		for _, n := range rule.Nodes {
			var items []*pg.Node
			switch {
			case n.Schema != "":
				items = append(items, pg.MakeStrNode(n.Schema))
			case schema != "":
				items = append(items, pg.MakeStrNode(schema))
			}
			items = append(items, pg.MakeStrNode(n.Table))
			perDS[n.DataSource] = append(perDS[n.DataSource], pg.MakeListNode(items))
		}
	}
	return a.emitPerDataSource(perDS, func(objs []*pg.Node) { d.Objects = objs }, stmt)
}

// emitPerDataSource makes one statement per data source, in data source order.
func (a *analyzer) emitPerDataSource(perDS map[int][]*pg.Node, set func([]*pg.Node), stmt *pg.Node) error {
	for ds := range a.p.rules.NumDataSources() {
		objs, ok := perDS[ds]
		if !ok {
			continue
		}
		set(objs)
		sql, err := a.deparse(stmt)
		if err != nil {
			return err
		}
		a.plan.ddl.targets = append(a.plan.ddl.targets, Target{DataSource: ds, Shard: -1, SQL: sql})
	}
	return nil
}

// perDataSource handles statements over a list of tables (TRUNCATE): each data source
// gets the physical tables it holds.
func (a *analyzer) perDataSource(stmt *pg.Node, rels []*pg.Node, _ string) error {
	perDS := map[int][]*pg.Node{}
	for _, r := range rels {
		rv := r.GetRangeVar()
		rule := a.p.rules.Lookup(rv.Relname)
		a.plan.Tables = appendUnique(a.plan.Tables, rv.Relname)
		for _, n := range rule.Nodes {
			c := cloneNode(r)
			setNode(c.GetRangeVar(), n)
			perDS[n.DataSource] = append(perDS[n.DataSource], c)
		}
	}
	t := stmt.GetTruncateStmt()
	return a.emitPerDataSource(perDS, func(objs []*pg.Node) { t.Relations = objs }, stmt)
}

func (a *analyzer) perDataSourceVacuum(stmt *pg.Node, v *pg.VacuumStmt) error {
	perDS := map[int][]*pg.Node{}
	for _, r := range v.Rels {
		vr := r.GetVacuumRelation()
		rule := a.p.rules.Lookup(vr.Relation.Relname)
		a.plan.Tables = appendUnique(a.plan.Tables, vr.Relation.Relname)
		for _, n := range rule.Nodes {
			c := cloneNode(r)
			setNode(c.GetVacuumRelation().Relation, n)
			perDS[n.DataSource] = append(perDS[n.DataSource], c)
		}
	}
	return a.emitPerDataSource(perDS, func(objs []*pg.Node) { v.Rels = objs }, stmt)
}

func (a *analyzer) createView(v *pg.ViewStmt) error {
	s, err := a.collectSelect(v.Query.GetSelectStmt(), nil)
	if err != nil {
		return err
	}
	for _, r := range s.refs {
		if r.sharded() {
			return unsupported("a view over sharded table %s: each shard would see only its own rows", r.name)
		}
	}
	if a.p.rules.Lookup(v.View.Relname).Kind != rules.KindDefault {
		return unsupported("a view named like sharded or broadcast table %s", v.View.Relname)
	}
	a.plan.ddl.targets = []Target{{DataSource: a.p.rules.DefaultDataSource(), Shard: -1, SQL: a.sql}}
	return nil
}

func (a *analyzer) createTableAs(c *pg.CreateTableAsStmt) error {
	if rel := c.Into.GetRel(); rel != nil && a.p.rules.Lookup(rel.Relname).Kind != rules.KindDefault {
		return unsupported("CREATE TABLE ... AS for sharded or broadcast table %s: create it, then INSERT", rel.Relname)
	}
	if sel := c.Query.GetSelectStmt(); sel != nil {
		if _, err := a.collectSelect(sel, nil); err != nil {
			return err
		}
	}
	for _, r := range a.plan.refs {
		if r.sharded() || r.rule.Nodes[0].DataSource != a.p.rules.DefaultDataSource() && r.rule.Kind == rules.KindDefault {
			return unsupported("CREATE TABLE ... AS over sharded table %s", r.name)
		}
	}
	a.plan.ddl.targets = []Target{{DataSource: a.p.rules.DefaultDataSource(), Shard: -1, SQL: a.sql}}
	return nil
}

// analyzeLock routes LOCK TABLE to the data sources holding the tables.
func (a *analyzer) analyzeLock(l *pg.LockStmt) error {
	a.plan.Kind = KindDDL
	a.plan.ddl = &ddlSpec{}
	perDS := map[int][]*pg.Node{}
	for _, r := range l.Relations {
		rv := r.GetRangeVar()
		rule := a.p.rules.Lookup(rv.Relname)
		for _, n := range rule.Nodes {
			c := cloneNode(r)
			setNode(c.GetRangeVar(), n)
			perDS[n.DataSource] = append(perDS[n.DataSource], c)
		}
	}
	stmt := &pg.Node{Node: &pg.Node_LockStmt{LockStmt: l}}
	if err := a.emitPerDataSource(perDS, func(objs []*pg.Node) { l.Relations = objs }, stmt); err != nil {
		return err
	}
	a.plan.Kind = KindLock
	return nil
}

// analyzeExplain plans EXPLAIN of a statement that runs on one target.
func (a *analyzer) analyzeExplain(e *pg.ExplainStmt) error {
	switch q := e.Query.Node.(type) {
	case *pg.Node_SelectStmt:
		if err := a.analyzeSelect(q.SelectStmt); err != nil {
			return err
		}
	case *pg.Node_UpdateStmt:
		if err := a.analyzeUpdate(q.UpdateStmt); err != nil {
			return err
		}
	case *pg.Node_DeleteStmt:
		if err := a.analyzeDelete(q.DeleteStmt); err != nil {
			return err
		}
	default:
		return unsupported("EXPLAIN of this statement type")
	}
	a.plan.Kind = KindExplain
	a.plan.merge, a.plan.mergeTmpl, a.plan.keyUpdates = nil, nil, nil
	a.plan.tmpl = nil
	return a.singleTemplate(&pg.Node{Node: &pg.Node_ExplainStmt{ExplainStmt: e}})
}

// analyzeCopy describes COPY ... FROM STDIN and COPY ... TO STDOUT.
func (a *analyzer) analyzeCopy(c *pg.CopyStmt) error {
	a.plan.Kind = KindCopy
	spec := &CopySpec{From: c.IsFrom}
	a.plan.Copy = spec
	a.plan.Write = c.IsFrom
	if c.Relation == nil {
		return a.copyQuery(c, spec)
	}
	spec.Table = a.p.rules.Lookup(c.Relation.Relname)
	if c.IsProgram || c.Filename != "" {
		switch {
		case len(spec.Table.Nodes) == 1 || !c.IsFrom && spec.Table.Kind == rules.KindBroadcast:
			// One copy of the rows: the server holding it reads or writes the file.
			spec.Server = true
		case !c.IsFrom:
			return unsupported("COPY of sharded table %s TO a server file or program (its rows are on several shards); use COPY ... TO STDOUT, as psql's \\copy does", spec.Table.Name)
		default:
			return a.stageCopy(c, spec)
		}
	}
	a.plan.Tables = appendUnique(a.plan.Tables, c.Relation.Relname)
	for _, col := range c.Attlist {
		spec.Columns = append(spec.Columns, col.GetString_().Sval)
	}
	for _, o := range c.Options {
		de := o.GetDefElem()
		spec.Options = append(spec.Options, CopyOption{Name: de.Defname, Value: defElemValue(de)})
	}
	stmt := &pg.Node{Node: &pg.Node_CopyStmt{CopyStmt: c}}
	name := c.Relation.Relname
	for _, n := range spec.Table.Nodes {
		sql := a.sql
		if n.Table != name || n.Schema != "" {
			relname, schema := c.Relation.Relname, c.Relation.Schemaname
			setNode(c.Relation, n)
			s, err := a.deparse(stmt)
			c.Relation.Relname, c.Relation.Schemaname = relname, schema
			if err != nil {
				return err
			}
			sql = s
		}
		spec.SQL = append(spec.SQL, sql)
	}
	return nil
}

// CopyQueryMarker stands for the query in CopySpec.Wrap.
const CopyQueryMarker = "SELECT " + markerPrefix + "copy_query"

// copyQuery plans COPY (query) TO STDOUT: the query is planned as a statement of its
// own (Query), and a target that answers it alone gets the COPY around its own
// statement (Wrap, with the client's options).
func (a *analyzer) copyQuery(c *pg.CopyStmt, spec *CopySpec) error {
	if a.p.rules.OneShard() {
		return unsupported("COPY (query)") // passed through as written
	}
	if c.IsFrom || c.IsProgram || c.Filename != "" {
		return unsupported("COPY (query) TO a server file or program over several shards; use TO STDOUT, as psql's \\copy does")
	}
	if c.Query.GetSelectStmt() == nil {
		return unsupported("COPY (INSERT, UPDATE or DELETE ... RETURNING) TO STDOUT over several shards; run the statement with RETURNING")
	}
	query, err := a.deparse(c.Query)
	if err != nil {
		return err
	}
	spec.Query = query
	for _, o := range c.Options {
		de := o.GetDefElem()
		spec.Options = append(spec.Options, CopyOption{Name: de.Defname, Value: defElemValue(de)})
	}
	marker := &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
		TargetList: []*pg.Node{{Node: &pg.Node_ResTarget{ResTarget: &pg.ResTarget{Val: &pg.Node{Node: &pg.Node_ColumnRef{
			ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{{Node: &pg.Node_String_{String_: &pg.String{Sval: markerPrefix + "copy_query"}}}}}}}}}}},
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT, Op: pg.SetOperation_SETOP_NONE,
	}}}
	wrap := &pg.CopyStmt{Query: marker, Options: c.Options}
	spec.Wrap, err = a.deparse(&pg.Node{Node: &pg.Node_CopyStmt{CopyStmt: wrap}})
	if err != nil {
		return err
	}
	if !strings.Contains(spec.Wrap, CopyQueryMarker) {
		return fmt.Errorf("sqlplan: COPY printed without its query marker: %s", spec.Wrap)
	}
	return nil
}

// CopyStageTable is the temporary table a COPY FROM a server file or program into a
// table over several data sources reads the file into (see CopySpec.Stage).
const CopyStageTable = "shardlab_copy_source"

// stageCopy plans COPY FROM a server file or program into a table whose rows live on
// several data sources: the server of the table's first shard reads the file into a
// temporary table of the copied columns (Stage, with the client's options and WHERE
// clause), and its rows then go to their shards by COPY FROM STDIN (SQL).
func (a *analyzer) stageCopy(c *pg.CopyStmt, spec *CopySpec) error {
	for _, col := range c.Attlist {
		spec.Columns = append(spec.Columns, col.GetString_().Sval)
	}
	for _, o := range c.Options {
		de := o.GetDefElem()
		if strings.EqualFold(de.Defname, "freeze") && !slices.Contains([]string{"false", "off", "0", "no"}, strings.ToLower(defElemValue(de))) {
			// The rows travel through a cursor, whose snapshot COPY FREEZE refuses.
			return unsupported("COPY ... FREEZE from a server file or program into %s table %s (over several shards); load without FREEZE, or FROM STDIN (psql's \\copy)", spec.Table.Kind, spec.Table.Name)
		}
		spec.Options = append(spec.Options, CopyOption{Name: de.Defname, Value: defElemValue(de)})
	}
	if c.WhereClause != nil && c.Attlist != nil {
		// The staging table has the listed columns only; PostgreSQL would read the
		// others' defaults.
		var missing string
		walk(c.WhereClause, func(m proto.Message) bool {
			if cr, ok := m.(*pg.ColumnRef); ok && missing == "" {
				name := cr.Fields[len(cr.Fields)-1].GetString_().GetSval()
				if !slices.Contains(spec.Columns, name) {
					missing = name
				}
			}
			return true
		})
		if missing != "" {
			return unsupported("COPY ... WHERE on column %s, which the column list leaves out (over several shards); list it, or filter after loading", missing)
		}
	}
	stage := &pg.CopyStmt{
		Relation:    &pg.RangeVar{Schemaname: "pg_temp", Relname: CopyStageTable, Inh: true, Relpersistence: "p"},
		IsFrom:      true,
		IsProgram:   c.IsProgram,
		Filename:    c.Filename,
		Options:     c.Options,
		WhereClause: c.WhereClause,
	}
	var err error
	if spec.Stage, err = a.deparse(&pg.Node{Node: &pg.Node_CopyStmt{CopyStmt: stage}}); err != nil {
		return err
	}
	// The shards get the rows in COPY's text format, which every type reads (names
	// in reg* types resolved again on each shard); the proxy fixes the settings both
	// sides read and write it under (see the proxy's loadStaged).
	for _, n := range spec.Table.Nodes {
		rv := &pg.RangeVar{Relname: n.Table, Schemaname: n.Schema, Inh: true, Relpersistence: "p"}
		load := &pg.CopyStmt{Relation: rv, Attlist: c.Attlist, IsFrom: true}
		sql, err := a.deparse(&pg.Node{Node: &pg.Node_CopyStmt{CopyStmt: load}})
		if err != nil {
			return err
		}
		spec.SQL = append(spec.SQL, sql)
	}
	return nil
}

// CopyOption is one option of COPY ... WITH (...), such as format csv.
type CopyOption struct {
	Name, Value string
}

func defElemValue(de *pg.DefElem) string {
	if de.Arg == nil {
		return ""
	}
	switch v := de.Arg.Node.(type) {
	case *pg.Node_String_:
		return v.String_.Sval
	case *pg.Node_Integer:
		return fmt.Sprint(v.Integer.Ival)
	case *pg.Node_Boolean:
		return fmt.Sprint(v.Boolean.Boolval)
	case *pg.Node_AStar:
		return "*"
	case *pg.Node_List:
		var parts []string
		for _, item := range v.List.Items {
			parts = append(parts, item.GetString_().Sval)
		}
		return strings.Join(parts, ",")
	}
	return ""
}

// setNode makes a (cloned) table reference name physical table n.
func setNode(rv *pg.RangeVar, n rules.Node) {
	rv.Relname = n.Table
	if n.Schema != "" {
		rv.Schemaname = n.Schema
	}
}
