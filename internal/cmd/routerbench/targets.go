package routerbench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/shardlab/shardlab/lab/loadgen"
	"github.com/shardlab/shardlab/routing"
)

// Operations, the seed's three.
const (
	OpInsert = "insert"
	OpSelect = "select"
	OpUpdate = "update"
)

// Operations returns the operations in the order they run.
func Operations() []string { return []string{OpInsert, OpSelect, OpUpdate} }

// handle is one way of reaching the data: plain database/sql on physical tables (the
// application picks the table, as seed 004's JDBC baseline does), or shardlab's driver
// on the logical tables.
type handle struct {
	name   string  // the configuration, e.g. "direct-1db-1t", "router-2db-2t"
	read   *sql.DB // where selects go
	write  *sql.DB // where inserts and updates go (the same as read on PostgreSQL)
	tables int     // physical tables the application spreads over (direct only)
	router bool
	close  func() error
	idle   func() // closes the idle server connections between measurements; nil for none
}

// tableName is the physical name of a table for an order id, as the application picks
// it: PostgreSQL's hash partitioning, the driver's default, so that a direct layout and
// a router layout over the same database agree.
func (h *handle) tableName(base string, id int64) string {
	if h.router || h.tables <= 1 {
		return base
	}
	return base + "_" + strconv.Itoa(routing.PGPartition(routing.PGHashInt8(id), h.tables))
}

// statements holds one prepared statement per physical table.
type statements struct {
	byTable map[string]*sql.Stmt
}

func prepare(ctx context.Context, db *sql.DB, tables []string, sqlFor func(string) string) (*statements, error) {
	s := &statements{byTable: map[string]*sql.Stmt{}}
	for _, t := range tables {
		st, err := db.PrepareContext(ctx, sqlFor(t))
		if err != nil {
			return nil, fmt.Errorf("prepare on %s: %w", t, err)
		}
		s.byTable[t] = st
	}
	return s, nil
}

func (s *statements) close() {
	for _, st := range s.byTable {
		st.Close()
	}
}

// opTarget runs one operation as a loadgen.Target: select is a read, insert and update
// are writes. Keys are user0 .. userN; key i names the preloaded order orderID(seed, i).
type opTarget struct {
	h      *handle
	op     string
	seed   uint64
	st     *statements
	itemOf func(order string) string
	nextID *atomic.Uint64 // new order numbers for inserts, shared by every run
}

var _ loadgen.Target = (*opTarget)(nil)

func newTarget(ctx context.Context, h *handle, op string, seed uint64, nextID *atomic.Uint64) (*opTarget, error) {
	orders := []string{"t_order"}
	if !h.router && h.tables > 1 {
		orders = nil
		for i := range h.tables {
			orders = append(orders, "t_order_"+strconv.Itoa(i))
		}
	}
	item := func(order string) string { return strings.Replace(order, "t_order", "t_order_item", 1) }
	t := &opTarget{h: h, op: op, seed: seed, itemOf: item, nextID: nextID}
	var err error
	switch op {
	case OpInsert:
		t.st, err = prepare(ctx, h.write, orders, insertSQL)
	case OpSelect:
		t.st, err = prepare(ctx, h.read, orders, func(o string) string { return selectSQL(o, item(o)) })
	case OpUpdate:
		t.st, err = prepare(ctx, h.write, orders, updateSQL)
	default:
		err = fmt.Errorf("unknown operation %q", op)
	}
	return t, err
}

func keyIndex(key string) uint64 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(key, "user"), 10, 64)
	return n
}

// Read runs the select of the order key names.
func (t *opTarget) Read(ctx context.Context, key string) (bool, error) {
	id := orderID(t.seed, keyIndex(key))
	rows, err := t.st.byTable[t.h.tableName("t_order", id)].QueryContext(ctx, id)
	if err != nil {
		return false, err
	}
	found := rows.Next()
	var cols [17]any
	if found {
		ptrs := make([]any, len(cols))
		for i := range cols {
			ptrs[i] = &cols[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			rows.Close()
			return false, err
		}
	}
	rows.Close()
	return found, rows.Err()
}

// Write inserts a new order, or updates the order key names.
func (t *opTarget) Write(ctx context.Context, key, value string) error {
	if len(value) > 50 {
		value = value[:50]
	}
	switch t.op {
	case OpInsert:
		id := orderID(t.seed, t.nextID.Add(1))
		_, err := t.st.byTable[t.h.tableName("t_order", id)].ExecContext(ctx, id, value)
		return err
	default:
		id := orderID(t.seed, keyIndex(key))
		_, err := t.st.byTable[t.h.tableName("t_order", id)].ExecContext(ctx, value, id)
		return err
	}
}

// preload writes orders 0..n-1, each with one item, in batches of multi-row INSERTs.
func preload(ctx context.Context, h *handle, seed uint64, n int) error {
	const batch = 500
	for start := 0; start < n; start += batch {
		byTable := map[string][]int64{}
		for i := start; i < min(start+batch, n); i++ {
			id := orderID(seed, uint64(i))
			tbl := h.tableName("t_order", id)
			byTable[tbl] = append(byTable[tbl], id)
		}
		for tbl, ids := range byTable {
			var orders, items []string
			for _, id := range ids {
				orders = append(orders, fmt.Sprintf("(%d, 'order-%d', 0, 10, 1, 'dtest002@dangdang.com', 1, 6, 1, 0, 3, 'ttt ttt', 'beijingshijinganqu', 1, 1, 1, '100000', '01088888888', '13888888888', 'test message')", id, id))
				items = append(items, fmt.Sprintf("(%d, 1, 'order-%d', 0, 10, 1)", id, id))
			}
			if _, err := h.write.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES "+strings.Join(orders, ", ")); err != nil {
				return fmt.Errorf("preload %s: %w", tbl, err)
			}
			item := strings.Replace(tbl, "t_order", "t_order_item", 1)
			if _, err := h.write.ExecContext(ctx, "INSERT INTO "+item+" VALUES "+strings.Join(items, ", ")); err != nil {
				return fmt.Errorf("preload %s: %w", item, err)
			}
		}
	}
	return nil
}
