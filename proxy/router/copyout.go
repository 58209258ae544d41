package router

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlplan"
)

// copyQuery runs COPY (query) TO STDOUT over several shards. A query that one target
// answers alone runs there inside the client's COPY, so that the server writes every
// byte; any other streams through the SQL core's merge (sqlexec.Engine.Query) and the
// proxy writes the rows in COPY's text or CSV format, as PostgreSQL writes them, one
// row at a time.
func (s *Session) copyQuery(ctx context.Context, spec *sqlplan.CopySpec) error {
	plan, lits, err := s.r.planner.PlanSimple(s.planContext(ctx), spec.Query)
	if err != nil {
		return err
	}
	if plan.Kind != sqlplan.KindSelect {
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
	if single(b) && b.Targets[0].Params == nil {
		t := b.Targets[0]
		sql := strings.Replace(spec.Wrap, sqlplan.CopyQueryMarker, t.SQL, 1)
		return s.onDataSourceJoining(ctx, t.DataSource, func(c *backend.Conn, join []string) (bool, error) {
			return c.QueryAfter(ctx, join, sql, s.client)
		})
	}
	if embedsASCII[strings.ToUpper(s.told.told["client_encoding"])] {
		// A byte that looks like a backslash or a delimiter may be half a character.
		return sqlplan.Unsupported("COPY (query) TO STDOUT over several shards under client_encoding %s; use UTF8", s.told.told["client_encoding"])
	}
	f, err := copyOutFormat(spec.Options)
	if err != nil {
		return err
	}
	rows, err := s.queryRows(ctx, b, sqlplan.Args{}, nil)
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

// copyOutFormat reads COPY TO's options; those the proxy does not write (binary, a
// conversion to another encoding, FORCE_QUOTE) are refused.
func copyOutFormat(opts []sqlplan.CopyOption) (copyOut, error) {
	f := copyOut{delim: '\t', null: `\N`}
	var delim, null, quote, esc *string
	for _, o := range opts {
		v := o.Value
		switch strings.ToLower(o.Name) {
		case "format":
			switch strings.ToLower(v) {
			case "text":
			case "csv":
				f.csv = true
			default:
				return f, sqlplan.Unsupported("COPY (query) TO STDOUT in %s format over several shards; use text or csv", v)
			}
		case "delimiter":
			delim = &v
		case "null":
			null = &v
		case "quote":
			quote = &v
		case "escape":
			esc = &v
		case "header":
			switch strings.ToLower(v) {
			case "", "true", "on", "1", "yes":
				f.header = true
			case "false", "off", "0", "no":
			default:
				return f, pgError("22023", "header requires a Boolean value")
			}
		default:
			return f, sqlplan.Unsupported("COPY (query) TO STDOUT with option %s over several shards", o.Name)
		}
	}
	if f.csv {
		f.delim, f.null, f.quote = ',', "", '"'
	}
	one := func(v *string, what string, to *byte) error {
		if v == nil {
			return nil
		}
		if len(*v) != 1 {
			return pgError("22023", "COPY %s must be a single one-byte character", what)
		}
		*to = (*v)[0]
		return nil
	}
	if err := one(delim, "delimiter", &f.delim); err != nil {
		return f, err
	}
	if null != nil {
		f.null = *null
	}
	if (quote != nil || esc != nil) && !f.csv {
		return f, pgError("0A000", "COPY quote and escape available only in CSV mode")
	}
	if err := one(quote, "quote", &f.quote); err != nil {
		return f, err
	}
	f.esc = f.quote
	if err := one(esc, "escape", &f.esc); err != nil {
		return f, err
	}
	if f.delim == '\n' || f.delim == '\r' || f.delim == '\\' && !f.csv || f.csv && f.delim == f.quote {
		return f, sqlplan.Unsupported("COPY (query) TO STDOUT with delimiter %q over several shards", f.delim)
	}
	return f, nil
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
