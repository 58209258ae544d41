package sqlexec

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/sqlplan"
)

// An answer read in parts (Engine.QueryInParts): each target is a portal on its data
// source's server, all bound at once when the answer starts (so that they belong to the
// caller's subtransaction then, as the caller's own portal does: a ROLLBACK TO a later
// savepoint keeps them), and every fetch is one exchange on the connection (Execute
// with a row limit, then Sync), run when the merge needs the target's next rows.
// Between fetches the connections are idle inside the caller's transaction, which
// keeps the portals until it ends.

// A target's first fetch asks for one row: the size of its rows is not known yet, and a
// sort merge needs no more of it to start. Later fetches ask for about partsBytes of
// rows at the size met so far, within partsRows, and no more than the caller said it
// will read next (Rows.FetchHint). Each fetch is a round trip the merge waits for, so
// its parts are larger than a stream's batches.
const (
	partsBytes = 256 << 10
	partsRows  = 1024
)

// portalSeq numbers the portals of answers read in parts, so that no name comes twice
// on a connection.
var portalSeq atomic.Uint64

// portalPrefix starts their names.
const portalPrefix = "sqlexec_parts_"

// parts is the state of an answer read in parts.
type parts struct {
	ctx     context.Context
	args    sqlplan.Args
	formats []int16
	names   []string // by target: its portal
	first   []*batch // by target: its first fetch, made when it was bound, until read
	want    []uint32 // by target: rows its next fetch asks for
	hint    uint32   // rows the caller reads next (0: not known)
	used    []int    // the data sources, in order
}

// startParts prepares a stream whose targets are fetched in parts; bind binds them.
func (e *Engine) startParts(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, conns Conns) *stream {
	st := &stream{e: e, b: b, conns: conns, cancel: func() {}, errs: make([]error, e.rules.NumDataSources()), left: -1}
	if m := b.Merge; m != nil {
		st.skip, st.left = max(b.Offset, 0), b.Limit
	}
	st.parts = &parts{ctx: ctx, args: args, formats: formats, names: make([]string, len(b.Targets)),
		first: make([]*batch, len(b.Targets)), want: make([]uint32, len(b.Targets))}
	for i := range b.Targets {
		st.curs = append(st.curs, &cursor{target: i})
	}
	return st
}

// bind binds every target's portal, in one exchange per data source, the data sources
// at once, and fetches the first row of those the merge starts from: every target's
// for a sort or grouping merge (each shard starts its work as it would for a stream),
// the first target's for a concatenation (the others compute nothing until they are
// read, as one server would not).
func (p *parts) bind(st *stream) error {
	byDS := map[int][]int{}
	for i, t := range st.b.Targets {
		if _, ok := byDS[t.DataSource]; !ok {
			p.used = append(p.used, t.DataSource)
		}
		byDS[t.DataSource] = append(byDS[t.DataSource], i)
		p.names[i] = portalPrefix + strconv.FormatUint(portalSeq.Add(1), 10)
		p.want[i] = 1
	}
	slices.Sort(p.used)
	errs := make([]error, len(p.used))
	var wg sync.WaitGroup
	for k, ds := range p.used {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batches, err := p.exchange(st, ds, byDS[ds], p.startsFrom(st))
			for j, i := range byDS[ds] {
				if err == nil {
					p.first[i] = batches[j]
				}
			}
			errs[k] = err
		}()
	}
	wg.Wait()
	// The first failure that is a data source's own: another's may have failed the
	// transaction under it at the same time (ErrTxAborted).
	failed := -1
	for k, err := range errs {
		if err != nil && (failed < 0 || errors.Is(errs[failed], ErrTxAborted) && !errors.Is(err, ErrTxAborted)) {
			failed = k
		}
	}
	if failed >= 0 {
		return st.e.shardErr(p.used[failed], errs[failed])
	}
	return nil
}

// fetch returns cursor c's target's next rows: the first fetch's, then one exchange's.
func (p *parts) fetch(st *stream, c *cursor) (batch, error) {
	if bt := p.first[c.target]; bt != nil {
		p.first[c.target] = nil
		return *bt, nil
	}
	batches, err := p.exchange(st, st.b.Targets[c.target].DataSource, []int{c.target}, nil)
	if err != nil {
		return batch{}, err
	}
	return *batches[0], nil
}

// startsFrom reports, for binding, whether the merge starts from target i's first row.
func (p *parts) startsFrom(st *stream) func(i int) bool {
	m := st.b.Merge
	all := m != nil && (m.Aggregate || m.Distinct || len(m.OrderBy) > 0)
	return func(i int) bool { return all || i == 0 }
}

// exchange runs one exchange on data source ds: for each target, its portal bound and
// described first when bind is set (and then asked for its first row only where
// bind(i) says so), else asked for its next rows; then Sync. It returns each target's
// batch (for a target bound but not asked, its columns alone) and sizes its next fetch.
func (p *parts) exchange(st *stream, ds int, targets []int, bind func(i int) bool) ([]*batch, error) {
	out := make([]*batch, len(targets))
	asked := make([]bool, len(targets))
	err := st.conns.Run(p.ctx, ds, func(conn *pgconn.PgConn) error {
		fe := conn.Frontend()
		for k, i := range targets {
			asked[k] = bind == nil || bind(i)
			if bind != nil {
				t := st.b.Targets[i]
				values, oids, pformats := TargetParams(t, p.args)
				fe.Send(&pgproto3.Parse{Query: t.SQL, ParameterOIDs: oids})
				fe.Send(&pgproto3.Bind{DestinationPortal: p.names[i], ParameterFormatCodes: pformats, Parameters: values, ResultFormatCodes: p.formats})
				fe.Send(&pgproto3.Describe{ObjectType: 'P', Name: p.names[i]})
			}
			if !asked[k] {
				continue
			}
			want := p.want[i]
			if p.hint > 0 {
				want = min(want, p.hint)
			}
			fe.Send(&pgproto3.Execute{Portal: p.names[i], MaxRows: want})
		}
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			return err
		}
		k := 0 // the target the answer is about
		bt := &batch{}
		var buf []byte
		size := 0
		var serverErr error
		for {
			msg, err := conn.ReceiveMessage(p.ctx)
			if err != nil {
				return err
			}
			switch m := msg.(type) {
			case *pgproto3.RowDescription, *pgproto3.NoData:
				if rd, ok := m.(*pgproto3.RowDescription); ok {
					bt.fields = fieldsOf(rd.Fields)
				}
				if k < len(targets) && !asked[k] {
					out[k] = bt // bound and described: its rows come with its first fetch
					k++
					bt = &batch{}
				}
			case *pgproto3.DataRow:
				row, need := copyRow(&buf, m.Values)
				bt.rows = append(bt.rows, row)
				size += need
			case *pgproto3.PortalSuspended, *pgproto3.CommandComplete:
				if cc, ok := m.(*pgproto3.CommandComplete); ok {
					bt.tag, bt.end = pgconn.NewCommandTag(string(cc.CommandTag)), true
				}
				if k < len(targets) {
					if len(bt.rows) > 0 {
						per := max(1, size/len(bt.rows)+24*len(bt.rows[0]))
						p.want[targets[k]] = uint32(min(partsRows, max(1, partsBytes/per)))
					}
					out[k] = bt
				}
				k++
				bt, buf, size = &batch{}, nil, 0
			case *pgproto3.ErrorResponse:
				serverErr = pgconn.ErrorResponseToPgError(m)
			case *pgproto3.ReadyForQuery:
				if serverErr == nil && k < len(targets) {
					return errors.New("sqlexec: a shard's answer ended before its end")
				}
				return serverErr
			}
		}
	})
	return out, err
}

// fieldsOf converts a RowDescription's fields.
func fieldsOf(fs []pgproto3.FieldDescription) []pgconn.FieldDescription {
	out := make([]pgconn.FieldDescription, len(fs))
	for i, f := range fs {
		out[i] = pgconn.FieldDescription{Name: string(f.Name), TableOID: f.TableOID, TableAttributeNumber: f.TableAttributeNumber,
			DataTypeOID: f.DataTypeOID, DataTypeSize: f.DataTypeSize, TypeModifier: f.TypeModifier, Format: f.Format}
	}
	return out
}

// close closes the portals of targets not read to their end, in one exchange per data
// source, and releases the connections. A portal that ended stays until the
// transaction ends, as on PostgreSQL; a failure to close is the transaction's to meet.
func (p *parts) close(st *stream) error {
	open := map[int][]string{}
	for _, c := range st.curs {
		if name := p.names[c.target]; name != "" && !c.ended {
			ds := st.b.Targets[c.target].DataSource
			open[ds] = append(open[ds], name)
		}
		c.rows = nil
	}
	for ds, names := range open {
		st.conns.Run(p.ctx, ds, func(conn *pgconn.PgConn) error {
			fe := conn.Frontend()
			for _, name := range names {
				fe.Send(&pgproto3.Close{ObjectType: 'P', Name: name})
			}
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				return err
			}
			for {
				msg, err := conn.ReceiveMessage(p.ctx)
				if err != nil {
					return err
				}
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					return nil
				}
			}
		})
	}
	for _, ds := range p.used {
		st.conns.Release(ds, nil)
	}
	return nil
}
