package router

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/copyin"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// copyQuery runs COPY (query) TO STDOUT over several shards. A query that one target
// answers alone runs there inside the client's COPY, so that the server writes every
// byte; any other streams through the SQL core's merge (sqlexec.Engine.Query) and the
// proxy writes the rows in COPY's text or CSV format, as PostgreSQL writes them, one
// row at a time. stmt is the client's statement, where an error's position counts.
func (s *Session) copyQuery(ctx context.Context, stmt string, spec *sqlplan.CopySpec) error {
	var sent []string // the statements sent, as far as the error may come from them
	err := s.copyQuerySent(ctx, spec, &sent)
	return sqlexec.AtClient(err, stmt, sent)
}

func (s *Session) copyQuerySent(ctx context.Context, spec *sqlplan.CopySpec, sent *[]string) error {
	plan, lits, err := s.r.planner.PlanSimple(s.planContext(ctx), spec.Query)
	if err != nil {
		return err
	}
	if plan.Kind != sqlplan.KindSelect && plan.Kind != sqlplan.KindCoordinator {
		return sqlplan.Unsupported("COPY (%s) TO STDOUT over several shards", plan.Kind)
	}
	bind := plan.BindSimple
	if s.foreignText() {
		bind = plan.BindSimpleForeign
	}
	b, err := bind(spec.Query, lits)
	if err != nil {
		return err
	}
	if b.Coordinated() {
		// The coordinator database writes every byte, as one database would.
		sql := strings.Replace(spec.Wrap, sqlplan.CopyQueryMarker, b.Targets[0].SQL, 1)
		*sent = []string{sql}
		return s.runCoordinated(ctx, b, nil, false, func(c *backend.Conn) error {
			_, err := c.QueryAfter(ctx, nil, sql, s.client)
			return err
		})
	}
	if single(b) && b.Targets[0].Params == nil {
		t := b.Targets[0]
		sql := strings.Replace(spec.Wrap, sqlplan.CopyQueryMarker, t.SQL, 1)
		*sent = []string{sql}
		return s.onDataSourceJoining(ctx, t.DataSource, func(c *backend.Conn, join []string) (bool, error) {
			return c.QueryAfter(ctx, join, sql, s.client)
		})
	}
	if s.embedsASCIIText() {
		// A byte that looks like a backslash or a delimiter may be half a character.
		return sqlplan.Unsupported("COPY (query) TO STDOUT over several shards under client_encoding %s; use UTF8", s.told.told["client_encoding"])
	}
	// The server checks the options as PostgreSQL would (its errors, word for word),
	// on a query with no rows; then the proxy refuses those it does not write.
	probe := strings.Replace(spec.Wrap, sqlplan.CopyQueryMarker, "SELECT 1 WHERE false", 1)
	ds := b.Targets[0].DataSource
	*sent = []string{probe}
	if err := s.onDataSourceJoining(ctx, ds, func(c *backend.Conn, join []string) (bool, error) {
		return c.QueryAfter(ctx, join, probe, discard{})
	}); err != nil {
		return err
	}
	*sent = sqlexec.SentTexts(b, nil) // every target's: the position must read alike in each
	f, err := copyOutFormat(spec.Options)
	if err != nil {
		return err
	}
	defer s.multiTarget(b)()
	rows, err := s.r.engine.Query(ctx, b, sqlplan.Args{}, nil, &s.conns)
	if err != nil {
		return err
	}
	defer rows.Close()
	fields := rows.Fields()
	s.client.Send(&pgproto3.CopyOutResponse{OverallFormat: 0, ColumnFormatCodes: make([]uint16, len(fields))})
	var line []byte
	if f.header {
		names := make([][]byte, len(fields))
		for i, fd := range fields {
			names[i] = []byte(fd.Name)
		}
		line = f.appendRow(line[:0], names)
		s.client.Send(&pgproto3.CopyData{Data: line})
	}
	n := int64(0)
	for rows.Next() {
		line = f.appendRow(line[:0], rows.Values())
		s.client.Send(&pgproto3.CopyData{Data: line})
		n++
		if n%relayCheck == 0 && s.client.Flush() != nil {
			rows.Abort() // the client is gone: stop the shards
			return nil
		}
	}
	if _, err := rows.Close(); err != nil {
		// PostgreSQL ends a COPY TO that fails with the error alone.
		return err
	}
	s.client.Send(&pgproto3.CopyDone{})
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY " + strconv.FormatInt(n, 10))})
	return nil
}

// copyOut is how COPY TO writes rows: PostgreSQL's options for text and CSV.
type copyOut struct {
	csv        bool
	delim      byte
	null       string
	quote, esc byte
	header     bool
}

// copyOutFormat reads COPY TO's options, as COPY FROM's are read (package copyin);
// those the proxy does not write (binary, FORCE_QUOTE, ENCODING ...) are refused.
func copyOutFormat(opts []sqlplan.CopyOption) (copyOut, error) {
	var in []copyin.Option
	for _, o := range opts {
		switch strings.ToLower(o.Name) {
		case "format", "delimiter", "null", "quote", "escape", "header":
			in = append(in, copyin.Option{Name: o.Name, Value: o.Value})
		default:
			return copyOut{}, sqlplan.Unsupported("COPY (query) TO STDOUT with option %s over several shards", o.Name)
		}
	}
	f, err := copyin.ParseFormat(in)
	if err != nil {
		return copyOut{}, sqlplan.Unsupported("COPY (query) TO STDOUT over several shards: %v", err)
	}
	return copyOut{csv: f.CSV, delim: f.Delimiter, null: f.Null, quote: f.Quote, esc: f.Escape, header: f.Header}, nil
}

// appendRow appends one row (or the header's names) as PostgreSQL's COPY TO writes it.
func (f copyOut) appendRow(buf []byte, values [][]byte) []byte {
	for i, v := range values {
		if i > 0 {
			buf = append(buf, f.delim)
		}
		switch {
		case v == nil:
			buf = append(buf, f.null...)
		case f.csv:
			buf = f.appendCSV(buf, v, len(values) == 1)
		default:
			buf = f.appendText(buf, v)
		}
	}
	return append(buf, '\n')
}

// appendText escapes a value as CopyAttributeOutText does.
func (f copyOut) appendText(buf, v []byte) []byte {
	for _, c := range v {
		switch c {
		case '\b':
			buf = append(buf, '\\', 'b')
		case '\f':
			buf = append(buf, '\\', 'f')
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\r':
			buf = append(buf, '\\', 'r')
		case '\t':
			buf = append(buf, '\\', 't')
		case '\v':
			buf = append(buf, '\\', 'v')
		case '\\':
			buf = append(buf, '\\', '\\')
		default:
			if c == f.delim {
				buf = append(buf, '\\')
			}
			buf = append(buf, c)
		}
	}
	return buf
}

// appendCSV quotes a value as CopyAttributeOutCSV does: when it equals the NULL
// string, holds the delimiter, the quote, a line break, or is a lone \. that would end
// the data; quotes and escapes inside are escaped.
func (f copyOut) appendCSV(buf, v []byte, single bool) []byte {
	quote := string(v) == f.null || single && string(v) == `\.`
	for _, c := range v {
		if c == f.delim || c == f.quote || c == '\n' || c == '\r' {
			quote = true
			break
		}
	}
	if !quote {
		return append(buf, v...)
	}
	buf = append(buf, f.quote)
	for _, c := range v {
		if c == f.quote || c == f.esc {
			buf = append(buf, f.esc)
		}
		buf = append(buf, c)
	}
	return append(buf, f.quote)
}

// embedsASCII names the client encodings whose multibyte characters may hold bytes
// that read as ASCII.
var embedsASCII = map[string]bool{"SJIS": true, "SHIFT_JIS_2004": true, "BIG5": true, "GBK": true, "UHC": true, "GB18030": true, "JOHAB": true}
