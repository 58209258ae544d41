package sqlplan

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/rules"
)

// Keys the application does not send. A sharded table whose key column is serial,
// bigserial, an identity column or DEFAULT nextval(...) has that sequence on every
// data source (its CREATE TABLE ran on each), and each would hand out the same
// values. The planner takes them from one: the sequence of the table's first shard.
// For an INSERT that leaves the key out (or writes DEFAULT), the caller draws one
// value per such row there, in one round trip, and Bind routes each row by its value,
// written into the row as a constant. PostgreSQL's sequence makes the values unique
// across every proxy and driver process and keeps them across restarts; no node
// identifier or clock is involved, and the values stay the size the column was
// declared with (a serial is a 32-bit integer).

// KeySource says where the keys of an INSERT's rows come from.
type KeySource struct {
	// DataSource is the data source holding the sequence (the table's first shard's).
	DataSource int
	// Sequence is the sequence's schema-qualified name, quoted as identifiers.
	Sequence string
	// Count is how many rows take a key from it.
	Count int
	// Table and Column name the key.
	Table, Column string
	// TableOID and SequenceOID identify the first shard's physical table and the
	// sequence there; Always and OtherAlways are what the plan took of the identities
	// (KeyDefault). The draw checks them.
	TableOID, SequenceOID string
	Always, OtherAlways   bool
	// DefaultTree is the column's stored default expression ("" for an identity).
	DefaultTree string
}

// KeyDefault is what a catalog says of a sharding key column's default.
type KeyDefault struct {
	// Sequence is the sequence the default draws from (serial, identity, DEFAULT
	// nextval('s')), schema-qualified and quoted; "" for any other default.
	Sequence string
	// SequenceOID and TableOID are the sequence's and the table's OIDs, as text;
	// DefaultTree is the column's stored default expression ("" for an identity).
	SequenceOID, TableOID, DefaultTree string
	// Always: the column is GENERATED ALWAYS AS IDENTITY. OtherAlways: another
	// column of the table is.
	Always, OtherAlways bool
}

// SQL shows the query that draws the keys: Count values, in the rows' order. (The
// executor sends it with the name as a parameter, and checks the default too.)
func (k *KeySource) SQL() string {
	lit := "'" + strings.ReplaceAll(k.Sequence, "'", "''") + "'"
	if k.Count == 1 {
		return "SELECT pg_catalog.nextval(" + lit + "::pg_catalog.regclass)"
	}
	return fmt.Sprintf("SELECT pg_catalog.nextval(%s::pg_catalog.regclass) FROM pg_catalog.generate_series(1, %d)", lit, k.Count)
}

// ExplainKeys describes, for a plan with Keys, what runs without drawing any: the
// route depends on the keys drawn.
func (pl *Plan) ExplainKeys() string {
	k := pl.Keys
	return fmt.Sprintf("insert into %s: %d key(s) of %s drawn from sequence %s on %s, then each row goes to the shard its key names\n  draw: %s\n",
		k.Table, k.Count, k.Column, k.Sequence, pl.rules.DataSources()[k.DataSource].Name, k.SQL())
}

// check verifies that keys are what SQL drew: Count integers. They are written into
// the statement as they are.
func (k *KeySource) check(keys []string) error {
	if len(keys) != k.Count {
		return pgErr(CodeInternalError, "shardlab: %d keys drawn for %s.%s, the statement needs %d", len(keys), k.Table, k.Column, k.Count)
	}
	for _, key := range keys {
		if _, err := strconv.ParseInt(key, 10, 64); err != nil {
			return pgErr(CodeInternalError, "shardlab: key %q drawn for %s.%s is not an integer", key, k.Table, k.Column)
		}
	}
	return nil
}

// keySequences is implemented by catalogs that can name a key column's sequence.
type keySequences interface {
	// KeySequence reads a column's default on the table's first shard.
	KeySequence(ctx context.Context, table *rules.TableRule, column string) (KeyDefault, error)
}

// errNoKey refuses an INSERT that leaves a sharded table's key to a default that is
// not a sequence.
func errNoKey(table, key string) error {
	return unsupported("INSERT into sharded table %s without a value for its sharding key %s, whose default is not a sequence (serial, bigserial, identity or nextval): each shard would compute its own; give the key a sequence default, or generate ids in the client", table, key)
}

// drawKeys rewrites an INSERT into a sharded table whose single key column the
// statement leaves to its sequence: the key column joins the column list, each row
// that has no value for it (or DEFAULT) gets the slot of a key drawn at bind time,
// and the plan records where to draw them. It leaves the statement alone when every
// row has a key.
func (a *analyzer) drawKeys(ins *pg.InsertStmt, target *tableRef) error {
	keys := target.rule.KeyColumns()
	if len(keys) != 1 || a.p.rules.OneShard() {
		return nil // rules of one shard: the statement runs there as written
	}
	key := keys[0]
	sel := ins.SelectStmt.GetSelectStmt()
	defaultValues := ins.SelectStmt == nil
	if !defaultValues && (sel == nil || len(sel.ValuesLists) == 0 || sel.Op != pg.SetOperation_SETOP_NONE) {
		return nil // INSERT ... SELECT: refused by the caller
	}
	// Which rows need a key: every row when the key column is not listed, else the
	// rows that write DEFAULT there.
	var cols []string
	at := -1
	if !defaultValues {
		var err error
		if len(ins.Cols) > 0 {
			cols, err = a.insertColumns(ins, target)
		} else if a.p.cat != nil {
			cols, err = a.p.cat.Columns(a.ctx, target.rule)
		}
		if err != nil {
			return err
		}
		at = slices.Index(cols, key)
	}
	need := 0
	if !defaultValues {
		for _, row := range sel.ValuesLists {
			items := row.GetList().Items
			if at < 0 || at >= len(items) || items[at].GetSetToDefault() != nil {
				need++
			}
		}
	}
	userValue := ins.Override == pg.OverridingKind_OVERRIDING_USER_VALUE
	if !defaultValues && need == 0 && !userValue {
		return nil
	}
	ks, ok := a.p.cat.(keySequences)
	if !ok {
		if userValue && need == 0 {
			return nil
		}
		return errNoKey(target.name, key)
	}
	kd, err := ks.KeySequence(a.ctx, target.rule, key)
	if err != nil {
		return err
	}
	seq := kd.Sequence
	if seq != "" && userValue {
		// The identity ignores the values written and takes the shard's own sequence.
		return unsupported("INSERT ... OVERRIDING USER VALUE into sharded table %s: every row's key %s would come from the shard's own sequence; leave the key out instead", target.name, key)
	}
	if need == 0 && !defaultValues {
		return nil
	}
	if seq == "" {
		return errNoKey(target.name, key)
	}
	slot := func(i int) *pg.Node { return pg.MakeParamRefNode(int32(slotBase+slotKeys+i), -1) }
	drawn, rows := 0, 1
	switch {
	case defaultValues:
		ins.Cols = []*pg.Node{pg.MakeResTargetNodeWithName(key, -1)}
		ins.SelectStmt = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
			ValuesLists: []*pg.Node{pg.MakeListNode([]*pg.Node{slot(0)})},
			LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
			Op:          pg.SetOperation_SETOP_NONE,
		}}}
		drawn = 1
	case len(ins.Cols) > 0 && at >= len(sel.ValuesLists[0].GetList().Items):
		return nil // more columns than values: the caller says so, as PostgreSQL does
	case at < 0 || at >= len(sel.ValuesLists[0].GetList().Items):
		// Not among the columns written: it joins them, at the end.
		rows = len(sel.ValuesLists)
		if len(ins.Cols) == 0 {
			width := len(sel.ValuesLists[0].GetList().Items)
			if width > len(cols) {
				return nil // more values than columns: the shard says so
			}
			for _, c := range cols[:width] {
				ins.Cols = append(ins.Cols, pg.MakeResTargetNodeWithName(c, -1))
			}
		}
		ins.Cols = append(ins.Cols, pg.MakeResTargetNodeWithName(key, -1))
		for _, row := range sel.ValuesLists {
			l := row.GetList()
			l.Items = append(l.Items, slot(drawn))
			drawn++
		}
	default:
		rows = len(sel.ValuesLists)
		for _, row := range sel.ValuesLists {
			items := row.GetList().Items
			if at < len(items) && items[at].GetSetToDefault() != nil {
				items[at] = slot(drawn)
				drawn++
			}
		}
	}
	if kd.Always && drawn == rows && ins.Override == pg.OverridingKind_OVERRIDING_NOT_SET {
		// GENERATED ALWAYS takes a value only with OVERRIDING SYSTEM VALUE; every
		// row's value is the identity's own. (A statement where some row writes a key
		// of its own keeps failing on the shard, as on one database.) The clause would
		// let values into the table's other GENERATED ALWAYS columns too.
		if kd.OtherAlways {
			return unsupported("INSERT into sharded table %s without its key %s, a GENERATED ALWAYS identity, when another column is one too: the OVERRIDING SYSTEM VALUE that writes the drawn key would also let values into that column", target.name, key)
		}
		ins.Override = pg.OverridingKind_OVERRIDING_SYSTEM_VALUE
	}
	a.plan.Keys = &KeySource{DataSource: target.rule.Nodes[0].DataSource, Sequence: seq, Count: drawn, Table: target.name, Column: key,
		TableOID: kd.TableOID, SequenceOID: kd.SequenceOID, Always: kd.Always, OtherAlways: kd.OtherAlways, DefaultTree: kd.DefaultTree}
	return nil
}
