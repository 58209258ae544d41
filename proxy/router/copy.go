package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/copyin"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// copy runs COPY ... FROM STDIN or TO STDOUT.
func (s *Session) copy(ctx context.Context, plan *sqlplan.Plan) error {
	s.running = true // a serial column's default may call nextval
	defer func() { s.running = false }()
	switch {
	case plan.Copy.Query != "":
		return s.copyQuery(ctx, plan.SQL, plan.Copy)
	case plan.Copy.Stage != "":
		return s.copyFromServerFile(ctx, plan.Copy)
	case plan.Copy.Server:
		// The table has one copy of its rows: its server reads or writes the file.
		ds := plan.Copy.Table.Nodes[0].DataSource
		return s.onDataSourceJoining(ctx, ds, func(c *backend.Conn, join []string) (bool, error) {
			return c.QueryAfter(ctx, join, plan.Copy.SQL[0], s.client)
		})
	}
	if plan.Copy.From {
		return s.copyFrom(ctx, plan.Copy)
	}
	return s.copyTo(ctx, plan.Copy)
}

func copyOptions(spec *sqlplan.CopySpec) []copyin.Option {
	out := make([]copyin.Option, len(spec.Options))
	for i, o := range spec.Options {
		out[i] = copyin.Option{Name: o.Name, Value: o.Value}
	}
	return out
}

// copyTarget is one physical table a COPY FROM writes to.
type copyTarget struct {
	node int // index in the table rule's nodes
	ds   int
	sql  string
	// streamed targets get rows as they arrive; a data source with several physical
	// tables of the table streams to the first and gathers the others' rows, sent by a
	// second COPY on the same connection once the first has finished.
	streamed bool
	cp       *backend.Copy
	gathered []byte
}

// copyFrom loads COPY FROM STDIN data: a sharded table's rows go to the shard their
// key names, a broadcast table's to every data source. Several data sources are
// written in one transaction each, committed together (or in the client's open
// transaction, which is how pgbench -i's TRUNCATE and COPY ... FREEZE share one
// server transaction on each shard).
func (s *Session) copyFrom(ctx context.Context, spec *sqlplan.CopySpec) error {
	rule := spec.Table
	sharded := rule.Kind == rules.KindSharded
	var split *copyin.Splitter
	var keyCols []string
	var keyTypes map[string]rules.KeyType
	if sharded {
		if s.embedsASCIIText() {
			return sqlplan.Unsupported("COPY FROM STDIN into sharded table %s under a client_encoding whose characters may hold bytes that read as a backslash or a delimiter (SJIS, BIG5, GBK, UHC, GB18030, JOHAB); use UTF8", rule.Name)
		}
		format, err := copyin.ParseFormat(copyOptions(spec))
		if err != nil {
			return sqlplan.Unsupported("COPY into sharded table %s: %v", rule.Name, err)
		}
		cols := spec.Columns
		if cols == nil {
			if cols, err = s.r.catalog.CopyColumns(ctx, rule); err != nil {
				return err
			}
		}
		keyCols = rule.KeyColumns()
		var idx []int
		if idx, keyTypes, err = s.copyKeys(ctx, rule, cols); err != nil {
			return err
		}
		split = copyin.NewSplitter(format, idx)
	}

	var targets []*copyTarget
	seen := map[int]bool{}
	for i, n := range rule.Nodes {
		t := &copyTarget{node: i, ds: n.DataSource, sql: spec.SQL[i], streamed: !seen[n.DataSource]}
		seen[n.DataSource] = true
		targets = append(targets, t)
	}
	dss := slices.Sorted(func(yield func(int) bool) {
		for ds := range seen {
			if !yield(ds) {
				return
			}
		}
	})
	own := false
	if len(dss) > 1 && !s.explicit && !s.implicit {
		s.beginImplicit()
		own = true
	}
	err := s.onDataSources(ctx, dss, func(conns map[int]*backend.Conn) error {
		return s.copyStream(ctx, spec, targets, conns, split, keyCols, keyTypes)
	})
	if own {
		if cerr := s.endImplicit(ctx, err == nil); err == nil {
			err = cerr
		}
	}
	return err
}

// copyKeys finds a sharded table's key columns among the copied columns cols: their
// indexes, and their types (from the rules, or the catalog).
func (s *Session) copyKeys(ctx context.Context, rule *rules.TableRule, cols []string) ([]int, map[string]rules.KeyType, error) {
	var idx []int
	types := map[string]rules.KeyType{}
	for _, k := range rule.KeyColumns() {
		i := slices.Index(cols, k)
		if i < 0 {
			return nil, nil, sqlplan.Unsupported("COPY into sharded table %s without its sharding column %s: every row needs it to find its shard", rule.Name, k)
		}
		idx = append(idx, i)
		t := rule.KeyType(k)
		if t == rules.TypeUnknown {
			var err error
			if t, err = s.r.catalog.KeyType(ctx, rule, k); err != nil {
				return nil, nil, err
			}
		}
		types[k] = t
	}
	return idx, types, nil
}

// onDataSources runs fn holding the client's connections to every data source in dss
// (joining the open transaction), then releases them.
func (s *Session) onDataSources(ctx context.Context, dss []int, fn func(map[int]*backend.Conn) error) error {
	held := map[int]*backend.Conn{}
	var run func(i int) error
	run = func(i int) error {
		if i == len(dss) {
			return fn(held)
		}
		ds := dss[i]
		err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
			held[ds] = c
			return run(i + 1)
		})
		return err
	}
	return run(0)
}

// copyStream starts the COPY on every streamed target, tells the client to send its
// data, routes the rows, and finishes.
func (s *Session) copyStream(ctx context.Context, spec *sqlplan.CopySpec, targets []*copyTarget,
	conns map[int]*backend.Conn, split *copyin.Splitter, keyCols []string, keyTypes map[string]rules.KeyType) error {
	var resp *pgproto3.CopyInResponse
	for _, t := range targets {
		if !t.streamed {
			continue
		}
		cp, r, err := conns[t.ds].StartCopy(ctx, t.sql, s.client)
		if err != nil {
			s.abortCopies(ctx, targets, "another shard refused the COPY")
			return s.shardErr(t.ds, err)
		}
		t.cp = cp
		if resp == nil {
			resp = r
		}
	}
	s.client.Send(resp)
	if err := s.client.Flush(); err != nil {
		s.abortCopies(ctx, targets, "the client went away")
		return err
	}

	// Route the client's data until CopyDone or CopyFail. After an error the rest of the
	// data is read and dropped, since the client sends it all before it listens.
	var copyErr error
	foreign := s.foreignText()
	route := func(r copyin.Row) error {
		if r.Header {
			for _, t := range targets {
				if err := t.write(r.Data); err != nil {
					return s.shardErr(t.ds, err)
				}
			}
			return nil
		}
		keys := make(map[string]rules.Key, len(keyCols))
		for i, k := range keyCols {
			if r.Fields[i].Null {
				keys[k] = rules.NullKey()
				continue
			}
			if foreign && !isASCII(r.Fields[i].Value) {
				return sqlplan.Unsupported("COPY %s, line %d: a text sharding key with characters outside ASCII while client_encoding differs from the server's encoding (the row would be routed by the client's bytes, not the value the server stores); use client_encoding UTF8", spec.Table.Name, r.Line)
			}
			keys[k] = rules.TextKey(r.Fields[i].Value)
		}
		shards, err := spec.Table.ShardsFor(keys, keyTypes)
		if err != nil || len(shards) != 1 {
			if err == nil {
				err = errors.New("the key does not name one shard")
			}
			return pgError("22P02", "COPY %s, line %d: cannot route the row by its sharding key: %v", spec.Table.Name, r.Line, err)
		}
		t := targets[shards[0]]
		if err := t.write(r.Data); err != nil {
			return s.shardErr(t.ds, err)
		}
		return nil
	}
	for done := false; !done; {
		msg, err := s.client.Receive()
		if err != nil {
			s.abortCopies(ctx, targets, "the client went away")
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if copyErr != nil {
				continue
			}
			if split == nil {
				for _, t := range targets {
					if err := t.write(m.Data); err != nil {
						copyErr = s.shardErr(t.ds, err)
						break
					}
				}
				continue
			}
			copyErr = split.Write(m.Data, route)
		case *pgproto3.CopyDone:
			if copyErr == nil && split != nil {
				copyErr = split.Close(route)
			}
			done = true
		case *pgproto3.CopyFail:
			if copyErr == nil {
				copyErr = pgError("57014", "COPY from stdin failed: %s", m.Message)
			}
			done = true
		case *pgproto3.Flush, *pgproto3.Sync:
			// PostgreSQL ignores these during COPY.
		default:
			if copyErr == nil {
				copyErr = pgError("08P01", "unexpected message type 0x%02X during COPY from stdin", messageType(msg))
			}
			done = true
		}
	}
	var ek interface{ SQLState() string }
	if copyErr != nil && !errors.As(copyErr, &ek) {
		copyErr = pgError("22P04", "COPY %s: %v", spec.Table.Name, copyErr)
	}
	if copyErr != nil {
		s.abortCopies(ctx, targets, copyErr.Error())
		return copyErr
	}

	var total int64
	var firstErr error
	count := func(ds int, tag pgconn.CommandTag, err error) {
		if err != nil {
			if firstErr == nil {
				firstErr = s.shardErr(ds, err)
			}
			return
		}
		if spec.Table.Kind != rules.KindBroadcast || ds == targets[0].ds {
			total += tag.RowsAffected()
		}
	}
	for _, t := range targets {
		if t.cp != nil {
			tag, err := t.cp.Finish(ctx, "")
			t.cp = nil
			count(t.ds, tag, err)
		}
	}
	// Second round: the physical tables that gathered their rows.
	for _, t := range targets {
		if t.streamed || firstErr != nil {
			continue
		}
		cp, _, err := conns[t.ds].StartCopy(ctx, t.sql, s.client)
		if err != nil {
			count(t.ds, pgconn.CommandTag{}, err)
			continue
		}
		if err := cp.Write(t.gathered); err != nil {
			count(t.ds, pgconn.CommandTag{}, err)
			continue
		}
		tag, err := cp.Finish(ctx, "")
		count(t.ds, tag, err)
	}
	if firstErr != nil {
		return firstErr
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY " + strconv.FormatInt(total, 10))})
	return nil
}

// write sends or gathers one row (or chunk) for a target.
func (t *copyTarget) write(data []byte) error {
	if t.streamed {
		return t.cp.Write(data)
	}
	t.gathered = append(t.gathered, data...)
	return nil
}

// abortCopies fails the COPY on every target that started it.
func (s *Session) abortCopies(ctx context.Context, targets []*copyTarget, why string) {
	for _, t := range targets {
		if t.cp != nil {
			t.cp.Finish(ctx, why)
			t.cp = nil
		}
	}
}

func messageType(msg pgproto3.FrontendMessage) byte {
	b, err := msg.Encode(nil)
	if err != nil || len(b) == 0 {
		return 0
	}
	return b[0]
}

// copyTo runs COPY ... TO STDOUT: for a sharded table, each shard's rows in turn, as
// one COPY answer (a header line only from the first); for a broadcast table, one copy.
func (s *Session) copyTo(ctx context.Context, spec *sqlplan.CopySpec) error {
	rule := spec.Table
	nodes := []int{0}
	if rule.Kind == rules.KindSharded {
		nodes = nodes[:0]
		for i := range rule.Nodes {
			nodes = append(nodes, i)
		}
	}
	header := false
	for _, o := range spec.Options {
		switch strings.ToLower(o.Name) {
		case "format":
			if strings.EqualFold(o.Value, "binary") && len(nodes) > 1 {
				return sqlplan.Unsupported("binary COPY TO of sharded table %s (each shard's data has its own header); use text or csv", rule.Name)
			}
		case "header":
			header = !slices.Contains([]string{"false", "off", "0", "no"}, strings.ToLower(o.Value))
		}
	}
	sink := &copyOutSink{client: s.client, header: header}
	for k, i := range nodes {
		sink.node, sink.rows = k, 0
		ds := rule.Nodes[i].DataSource
		err := s.onDataSource(ctx, ds, func(c *backend.Conn) error { return c.Query(ctx, spec.SQL[i], sink) })
		if err != nil {
			return err
		}
	}
	if sink.started {
		s.client.Send(&pgproto3.CopyDone{})
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(fmt.Sprintf("COPY %d", sink.total))})
	return nil
}

// copyOutSink merges the COPY TO answers of several shards into one.
type copyOutSink struct {
	client  Client
	header  bool
	node    int   // which shard is answering (0 is the first)
	rows    int   // CopyData messages of this shard so far
	total   int64 // rows copied, from the command tags
	started bool
}

func (k *copyOutSink) Send(msg pgproto3.BackendMessage) {
	switch m := msg.(type) {
	case *pgproto3.CopyOutResponse:
		if !k.started {
			k.started = true
			k.client.Send(m)
		}
	case *pgproto3.CopyData:
		k.rows++
		if k.header && k.node > 0 && k.rows == 1 {
			return // the header line again
		}
		k.client.Send(m)
	case *pgproto3.CopyDone:
	case *pgproto3.CommandComplete:
		k.total += pgconn.NewCommandTag(string(m.CommandTag)).RowsAffected()
	default:
		k.client.Send(msg)
	}
}

// copyFetchRows is how many rows of a staged server file travel to the shards at a
// time: the proxy holds at most this many, once.
const copyFetchRows = 1000

// copyFromServerFile runs COPY FROM a server file or program into a table whose rows
// live on several data sources (sqlplan.CopySpec.Stage). In one transaction (the
// client's, or one of its own), on the client's own connection to the data source of
// the table's first shard, so with the client's rights on the server's files:
//   - that server reads the file into a temporary table of the copied columns, with
//     the client's options (format, header, WHERE ...), so its own COPY parser reads it;
//   - a cursor hands the rows out copyFetchRows at a time, in COPY's text format under
//     fixed settings (see loadStaged); each row goes to the physical table its sharding
//     key names (a broadcast table's to every data source), by one COPY FROM STDIN per
//     table and batch;
//   - the temporary table is dropped.
//
// The answer is COPY with the number of rows loaded, as PostgreSQL's. Under two-phase
// commit it is refused: PREPARE TRANSACTION cannot follow a temporary table.
func (s *Session) copyFromServerFile(ctx context.Context, spec *sqlplan.CopySpec) error {
	rule := spec.Table
	if s.r.committer.TwoPhase() {
		return sqlplan.Unsupported("COPY FROM a server file or program into %s table %s with two-phase commit (the file is staged in a temporary table, which PREPARE TRANSACTION refuses); use COPY FROM STDIN (psql's \\copy)", rule.Kind, rule.Name)
	}
	cols := spec.Columns
	if cols == nil {
		var err error
		if cols, err = s.r.catalog.CopyColumns(ctx, rule); err != nil {
			return err
		}
	}
	var keyIdx []int
	var keyTypes map[string]rules.KeyType
	if rule.Kind == rules.KindSharded {
		var err error
		if keyIdx, keyTypes, err = s.copyKeys(ctx, rule, cols); err != nil {
			return err
		}
	}
	seen := map[int]bool{}
	var dss []int
	for _, n := range rule.Nodes {
		if !seen[n.DataSource] {
			seen[n.DataSource] = true
			dss = append(dss, n.DataSource)
		}
	}
	slices.Sort(dss)
	own := false
	if !s.explicit && !s.implicit {
		s.beginImplicit()
		own = true
	}
	var total int64
	err := s.onDataSources(ctx, dss, func(conns map[int]*backend.Conn) error {
		var err error
		total, err = s.loadStaged(ctx, spec, cols, keyIdx, keyTypes, conns)
		return err
	})
	if own {
		if cerr := s.endImplicit(ctx, err == nil); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY " + strconv.FormatInt(total, 10))})
	return nil
}

// loadStaged stages the server file and moves its rows (see copyFromServerFile).
func (s *Session) loadStaged(ctx context.Context, spec *sqlplan.CopySpec, cols []string, keyIdx []int,
	keyTypes map[string]rules.KeyType, conns map[int]*backend.Conn) (int64, error) {
	rule := spec.Table
	first := rule.Nodes[0]
	src := conns[first.DataSource]
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = sqlplan.QuoteIdent(c)
	}
	table := sqlplan.QuoteIdent(first.Table)
	if first.Schema != "" {
		table = sqlplan.QuoteIdent(first.Schema) + "." + table
	}
	stage := "pg_temp." + sqlplan.QuoteIdent(sqlplan.CopyStageTable)
	const cursor = "shardlab_copy_rows"
	// The file is read under the client's settings (its encoding, unless the COPY
	// says ENCODING).
	for _, q := range []string{
		"CREATE TEMPORARY TABLE " + stage + " AS SELECT " + strings.Join(quoted, ", ") + " FROM " + table + " WITH NO DATA",
		spec.Stage,
	} {
		if _, err := src.Results(ctx, q); err != nil {
			return 0, s.shardErr(first.DataSource, err)
		}
	}
	// The rows then travel in COPY's text format, as pg_dump moves them: written and
	// read under fixed settings on both sides (the server's encoding, in which no
	// backslash hides in a multibyte character; every digit of a float; ISO dates),
	// and the client's settings are put back afterwards.
	encoding := src.PgConn().ParameterStatus("server_encoding")
	if encoding == "" {
		encoding = "UTF8"
	}
	transfer := []string{"client_encoding", encoding, "extra_float_digits", "3", "DateStyle", "ISO", "IntervalStyle", "postgres", "bytea_output", "hex"}
	restores := map[int]string{}
	for ds, c := range conns {
		restore, err := setLocally(ctx, c, transfer)
		if err != nil {
			return 0, s.shardErr(ds, err)
		}
		restores[ds] = restore
	}
	if _, err := src.Results(ctx, "DECLARE "+cursor+" NO SCROLL CURSOR FOR SELECT "+strings.Join(quoted, ", ")+" FROM "+stage); err != nil {
		return 0, s.shardErr(first.DataSource, err)
	}
	sharded := rule.Kind == rules.KindSharded
	batches := make([][]byte, len(rule.Nodes))
	if !sharded {
		batches = batches[:1] // one batch, for every physical table
	}
	keys := make(map[string]rules.Key, len(keyIdx))
	var total int64
	for {
		for i := range batches {
			batches[i] = batches[i][:0]
		}
		n := 0
		err := src.EachRow(ctx, "FETCH FORWARD "+strconv.Itoa(copyFetchRows)+" FROM "+cursor, nil, func(values [][]byte) error {
			n++
			b := 0
			if sharded {
				for j, k := range rule.KeyColumns() {
					if v := values[keyIdx[j]]; v == nil {
						keys[k] = rules.NullKey()
					} else {
						keys[k] = rules.TextKey(string(v))
					}
				}
				shards, err := rule.ShardsFor(keys, keyTypes)
				if err != nil || len(shards) != 1 {
					if err == nil {
						err = errors.New("the key does not name one shard")
					}
					return pgError("22P02", "COPY %s: cannot route a row by its sharding key: %v", rule.Name, err)
				}
				b = shards[0]
			}
			batches[b] = textCopy.appendRow(batches[b], values)
			return nil
		})
		if err != nil {
			return 0, s.shardErr(first.DataSource, err)
		}
		if n == 0 {
			break
		}
		for i, node := range rule.Nodes {
			batch := batches[min(i, len(batches)-1)]
			if len(batch) == 0 {
				continue
			}
			cp, _, err := conns[node.DataSource].StartCopy(ctx, spec.SQL[i], s.client)
			if err != nil {
				return 0, s.shardErr(node.DataSource, err)
			}
			if err := cp.Write(batch); err != nil {
				cp.Finish(ctx, "the copy failed")
				return 0, s.shardErr(node.DataSource, err)
			}
			tag, err := cp.Finish(ctx, "")
			if err != nil {
				return 0, s.shardErr(node.DataSource, err)
			}
			if sharded || i == 0 {
				total += tag.RowsAffected()
			}
		}
	}
	if _, err := src.Results(ctx, "CLOSE "+cursor+"; DROP TABLE "+stage); err != nil {
		return 0, s.shardErr(first.DataSource, err)
	}
	for ds, c := range conns {
		if _, err := c.Results(ctx, restores[ds]); err != nil {
			return 0, s.shardErr(ds, err)
		}
	}
	return total, nil
}

// setLocally sets parameters (name, value pairs) for the rest of c's transaction, and
// returns the statement that sets them back to what they were.
func setLocally(ctx context.Context, c *backend.Conn, pairs []string) (string, error) {
	var read, set []string
	for i := 0; i < len(pairs); i += 2 {
		read = append(read, "current_setting("+quoteLiteral(pairs[i])+")")
		set = append(set, "SET LOCAL "+pairs[i]+" = "+quoteLiteral(pairs[i+1]))
	}
	was, err := c.QueryRow(ctx, "SELECT "+strings.Join(read, ", "), len(read))
	if err != nil {
		return "", err
	}
	if _, err := c.Results(ctx, strings.Join(set, "; ")); err != nil {
		return "", err
	}
	var restore []string
	for i, v := range was {
		restore = append(restore, "SET LOCAL "+pairs[2*i]+" = "+quoteLiteral(string(v)))
	}
	return strings.Join(restore, "; "), nil
}

// textCopy writes rows in COPY's text format with its defaults.
var textCopy = copyOut{delim: '\t', null: `\N`}

// isASCII reports whether s has no byte outside ASCII.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
