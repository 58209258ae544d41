package sqlexec

import (
	"context"
	"slices"
	"strconv"
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

// partsFirstRows is how many rows a target's first fetch asks for; later fetches ask
// for about batchBytes of rows, at the size of the rows met so far, within batchRows.
const partsFirstRows = 32

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
	names   []string                    // by target: its portal
	fields  [][]pgconn.FieldDescription // by target: its columns, until its first fetch
	want    []uint32                    // by target: rows its next fetch asks for
	used    map[int]bool
}

// startParts prepares a stream whose targets are fetched in parts; bind binds them.
func (e *Engine) startParts(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, conns Conns) *stream {
	st := &stream{e: e, b: b, conns: conns, cancel: func() {}, errs: make([]error, e.rules.NumDataSources()), left: -1}
	if m := b.Merge; m != nil {
		st.skip, st.left = max(b.Offset, 0), b.Limit
	}
	st.parts = &parts{ctx: ctx, args: args, formats: formats, names: make([]string, len(b.Targets)),
		fields: make([][]pgconn.FieldDescription, len(b.Targets)), want: make([]uint32, len(b.Targets)), used: map[int]bool{}}
	for i := range b.Targets {
		st.curs = append(st.curs, &cursor{target: i})
		st.parts.want[i] = partsFirstRows
	}
	return st
}

// bind binds every target's portal and learns its columns, in one exchange per data
// source, the data sources one after another in their order (as a transaction's
// statements take them).
func (p *parts) bind(st *stream) error {
	byDS := map[int][]int{}
	var order []int
	for i, t := range st.b.Targets {
		if _, ok := byDS[t.DataSource]; !ok {
			order = append(order, t.DataSource)
		}
		byDS[t.DataSource] = append(byDS[t.DataSource], i)
	}
	slices.Sort(order)
	for _, ds := range order {
		p.used[ds] = true
		err := st.conns.Run(p.ctx, ds, func(conn *pgconn.PgConn) error {
			fe := conn.Frontend()
			for _, i := range byDS[ds] {
				t := st.b.Targets[i]
				p.names[i] = portalPrefix + strconv.FormatUint(portalSeq.Add(1), 10)
				values, oids, pformats := TargetParams(t, p.args)
				fe.Send(&pgproto3.Parse{Query: t.SQL, ParameterOIDs: oids})
				fe.Send(&pgproto3.Bind{DestinationPortal: p.names[i], ParameterFormatCodes: pformats, Parameters: values, ResultFormatCodes: p.formats})
				fe.Send(&pgproto3.Describe{ObjectType: 'P', Name: p.names[i]})
			}
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				return err
			}
			k := 0 // the next target to be described
			var serverErr error
			for {
				msg, err := conn.ReceiveMessage(p.ctx)
				if err != nil {
					return err
				}
				switch m := msg.(type) {
				case *pgproto3.RowDescription:
					if k < len(byDS[ds]) {
						p.fields[byDS[ds][k]] = fieldsOf(m.Fields)
					}
					k++
				case *pgproto3.NoData:
					k++
				case *pgproto3.ErrorResponse:
					serverErr = pgconn.ErrorResponseToPgError(m)
				case *pgproto3.ReadyForQuery:
					return serverErr
				}
			}
		})
		if err != nil {
			return st.e.shardErr(ds, err)
		}
	}
	return nil
}

// fetch runs one exchange for cursor c's target: it asks for the next rows.
func (p *parts) fetch(st *stream, c *cursor) (batch, error) {
	t := st.b.Targets[c.target]
	bt := batch{fields: p.fields[c.target]}
	p.fields[c.target] = nil
	err := st.conns.Run(p.ctx, t.DataSource, func(conn *pgconn.PgConn) error {
		fe := conn.Frontend()
		name := p.names[c.target]
		fe.Send(&pgproto3.Execute{Portal: name, MaxRows: p.want[c.target]})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			return err
		}
		var buf []byte
		size := 0
		var serverErr error
		for {
			msg, err := conn.ReceiveMessage(p.ctx)
			if err != nil {
				return err
			}
			switch m := msg.(type) {
			case *pgproto3.DataRow:
				row, need := copyRow(&buf, m.Values)
				bt.rows = append(bt.rows, row)
				size += need
			case *pgproto3.CommandComplete:
				bt.tag, bt.end = pgconn.NewCommandTag(string(m.CommandTag)), true
			case *pgproto3.ErrorResponse:
				serverErr = pgconn.ErrorResponseToPgError(m)
			case *pgproto3.ReadyForQuery:
				if serverErr == nil && len(bt.rows) > 0 {
					per := max(1, size/len(bt.rows)+24*len(bt.rows[0]))
					p.want[c.target] = uint32(min(batchRows, max(1, batchBytes/per)))
				}
				return serverErr
			}
		}
	})
	return bt, err
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
	for ds := range p.used {
		st.conns.Release(ds, nil)
	}
	return nil
}
