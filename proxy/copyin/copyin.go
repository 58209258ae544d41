// Package copyin splits the data of COPY ... FROM STDIN into rows and reads the fields
// a sharding proxy routes them by, in PostgreSQL's text and CSV formats.
//
// The client's CopyData messages cut the stream anywhere, even inside a row or a
// quoted CSV field, so a Splitter keeps what it has not yet seen the end of. It decodes
// only the fields it is asked for (the sharding key); every row goes on to a shard
// byte for byte as the client sent it, so the shard's own COPY parser has the last word
// on everything else.
package copyin

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Format is how COPY data is written: PostgreSQL's COPY options that matter for
// finding rows and fields.
type Format struct {
	CSV       bool
	Delimiter byte   // default tab (text) or comma (CSV)
	Null      string // default \N (text) or the empty string (CSV)
	Quote     byte   // CSV only; default "
	Escape    byte   // CSV only; default the quote character
	Header    bool   // the first line is a header, not data
}

// Option is one COPY option as the statement names it (format, delimiter, null,
// header, quote, escape ...); values are as written, booleans as "true", "on", "1" ...
type Option struct{ Name, Value string }

// ErrFormat is wrapped by errors about COPY options this package cannot split by.
var ErrFormat = errors.New("copyin: unsupported COPY format")

// ParseFormat reads the options of a COPY statement. Binary format returns an error
// wrapping ErrFormat: its rows cannot be split without decoding every column's type.
// Options that do not affect how rows and fields are found (FREEZE, ENCODING,
// FORCE_NOT_NULL ...) are ignored here; the shards still apply them.
func ParseFormat(opts []Option) (Format, error) {
	f := Format{Delimiter: '\t', Null: `\N`}
	var delim, null, quote, escape *string
	for _, o := range opts {
		v := o.Value
		switch strings.ToLower(o.Name) {
		case "format":
			switch strings.ToLower(v) {
			case "text":
			case "csv":
				f.CSV = true
			case "binary":
				return f, fmt.Errorf("%w: binary COPY data cannot be split by shard; use text or csv", ErrFormat)
			default:
				return f, fmt.Errorf("%w: COPY format %q", ErrFormat, v)
			}
		case "delimiter":
			delim = &v
		case "null":
			null = &v
		case "quote":
			quote = &v
		case "escape":
			escape = &v
		case "header":
			switch strings.ToLower(v) {
			case "", "true", "on", "1", "yes", "match":
				f.Header = true
			case "false", "off", "0", "no":
				f.Header = false
			default:
				return f, fmt.Errorf("%w: header %q", ErrFormat, v)
			}
		}
	}
	if f.CSV {
		f.Delimiter, f.Null, f.Quote = ',', "", '"'
	}
	if delim != nil {
		if len(*delim) != 1 {
			return f, fmt.Errorf("%w: COPY delimiter must be a single one-byte character", ErrFormat)
		}
		f.Delimiter = (*delim)[0]
	}
	if null != nil {
		f.Null = *null
	}
	if quote != nil {
		if len(*quote) != 1 {
			return f, fmt.Errorf("%w: COPY quote must be a single one-byte character", ErrFormat)
		}
		f.Quote = (*quote)[0]
	}
	f.Escape = f.Quote
	if escape != nil {
		if len(*escape) != 1 {
			return f, fmt.Errorf("%w: COPY escape must be a single one-byte character", ErrFormat)
		}
		f.Escape = (*escape)[0]
	}
	if f.Delimiter == '\n' || f.Delimiter == '\r' || (!f.CSV && f.Delimiter == '\\') {
		return f, fmt.Errorf("%w: COPY delimiter %q", ErrFormat, f.Delimiter)
	}
	return f, nil
}

// Field is a decoded field of a row.
type Field struct {
	Value string
	Null  bool
}

// Row is one row as the Splitter found it.
type Row struct {
	// Data is the row's bytes as the client sent them, with its line ending. It is
	// valid only until the emit function returns.
	Data []byte
	// Header is set for the header line (Format.Header): it goes to every shard, whose
	// COPY skips it too.
	Header bool
	// Fields are the decoded fields the Splitter was asked for, in the order of its
	// field indexes; nil for the header.
	Fields []Field
	// Line is the row's line number in the data, from 1, for error messages.
	Line int
}

// Splitter cuts a COPY data stream into rows. It is not safe for concurrent use.
type Splitter struct {
	f      Format
	want   []int // field indexes to decode
	maxCol int

	pending  []byte // the start of a row whose end has not arrived
	line     int    // rows seen so far
	rows     int
	done     bool // the end-of-data marker \. was seen
	inQuote  bool // CSV: the scan of pending stopped inside quotes
	scanned  int  // bytes of pending already scanned for the row's end
	escaping bool // text: the scan stopped right after a backslash
	fields   []Field
}

// NewSplitter returns a splitter for data in format f that decodes the fields at the
// given 0-based indexes of every row.
func NewSplitter(f Format, fields []int) *Splitter {
	s := &Splitter{f: f, want: fields, fields: make([]Field, len(fields))}
	for _, i := range fields {
		s.maxCol = max(s.maxCol, i)
	}
	return s
}

// Rows returns how many data rows (not counting a header) the splitter has emitted.
func (s *Splitter) Rows() int { return s.rows }

// Write consumes a chunk of COPY data and calls emit for every row it completes. An
// error from emit stops Write and is returned.
func (s *Splitter) Write(data []byte, emit func(Row) error) error {
	if s.done {
		return nil // PostgreSQL ignores whatever follows \.
	}
	buf := data
	if len(s.pending) > 0 {
		s.pending = append(s.pending, data...)
		buf = s.pending
	}
	start := 0
	pos := s.scanned
	for {
		end, ok := s.rowEnd(buf, pos)
		if !ok {
			// end is where the next scan resumes.
			s.scanned = end - start
			break
		}
		if err := s.row(buf[start:end], emit); err != nil {
			return err
		}
		if s.done {
			s.pending = s.pending[:0]
			return nil
		}
		start, pos = end, end
		s.inQuote, s.escaping = false, false
	}
	rest := buf[start:]
	if len(s.pending) > 0 {
		// Move the unfinished row to the front of pending, reusing its storage.
		n := copy(s.pending, rest)
		s.pending = s.pending[:n]
	} else {
		s.pending = append(s.pending[:0], rest...)
	}
	return nil
}

// Close emits the last row when the data does not end with a line ending.
func (s *Splitter) Close(emit func(Row) error) error {
	if s.done || len(s.pending) == 0 {
		return nil
	}
	if s.f.CSV && s.inQuote {
		return fmt.Errorf("unterminated CSV quoted field (line %d)", s.line+1)
	}
	row := s.pending
	s.pending = nil
	return s.row(row, emit)
}

// rowEnd finds the end of the row that starts before pos (just past its newline),
// continuing a scan that stopped at pos. When the row does not end in buf, it returns
// false and the position to resume the scan from once more data has arrived.
func (s *Splitter) rowEnd(buf []byte, pos int) (int, bool) {
	if s.f.CSV {
		q, e := s.f.Quote, s.f.Escape
		for i := pos; i < len(buf); i++ {
			c := buf[i]
			switch {
			case s.inQuote && c == e && e != q && i+1 < len(buf) && (buf[i+1] == q || buf[i+1] == e):
				i++ // an escaped quote or escape inside quotes
			case s.inQuote && c == e && e != q && i+1 == len(buf):
				// The escape's partner has not arrived: rescan from here next time.
				return i, false
			case c == q:
				// Inside quotes, a doubled quote ("") reads as leaving and entering again.
				s.inQuote = !s.inQuote
			case c == '\n' && !s.inQuote:
				return i + 1, true
			}
		}
		return len(buf), false
	}
	for i := pos; i < len(buf); i++ {
		c := buf[i]
		switch {
		case s.escaping:
			s.escaping = false
		case c == '\\':
			s.escaping = true
		case c == '\n':
			return i + 1, true
		}
	}
	return len(buf), false
}

// row handles one complete row (with its line ending, unless it is the last).
func (s *Splitter) row(data []byte, emit func(Row) error) error {
	s.line++
	body := data
	body = trimEOL(body)
	if isEndMarker(body) {
		s.done = true
		return nil
	}
	if s.f.Header && s.line == 1 {
		return emit(Row{Data: data, Header: true, Line: s.line})
	}
	if err := s.decode(body); err != nil {
		return fmt.Errorf("line %d: %w", s.line, err)
	}
	s.rows++
	return emit(Row{Data: data, Fields: s.fields, Line: s.line})
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b
}

// isEndMarker reports whether a line is the end-of-data marker \. alone.
func isEndMarker(line []byte) bool { return len(line) == 2 && line[0] == '\\' && line[1] == '.' }

// decode reads the wanted fields of one row's text (without its line ending).
func (s *Splitter) decode(body []byte) error {
	for i := range s.fields {
		s.fields[i] = Field{}
	}
	if len(s.want) == 0 {
		return nil
	}
	col, start := 0, 0
	inQuote := false
	q, e := s.f.Quote, s.f.Escape
	for i := 0; i <= len(body); i++ {
		end := i == len(body)
		if !end {
			c := body[i]
			if s.f.CSV {
				switch {
				case inQuote && c == e && e != q && i+1 < len(body) && (body[i+1] == q || body[i+1] == e):
					i++
					continue
				case c == q:
					inQuote = !inQuote
					continue
				case c != s.f.Delimiter || inQuote:
					continue
				}
			} else {
				if c == '\\' {
					i++
					continue
				}
				if c != s.f.Delimiter {
					continue
				}
			}
		}
		if inQuote && end {
			return errors.New("unterminated CSV quoted field")
		}
		if err := s.setField(col, body[start:min(i, len(body))]); err != nil {
			return err
		}
		col++
		start = i + 1
		if col > s.maxCol {
			return nil
		}
	}
	return fmt.Errorf("missing data for column %d (the row has %d)", s.maxCol+1, col)
}

// setField decodes raw field text if col is wanted.
func (s *Splitter) setField(col int, raw []byte) error {
	for k, w := range s.want {
		if w != col {
			continue
		}
		f, err := s.field(raw)
		if err != nil {
			return err
		}
		s.fields[k] = f
	}
	return nil
}

func (s *Splitter) field(raw []byte) (Field, error) {
	if s.f.CSV {
		// NULL is the null string unquoted; a quoted field is never NULL.
		if string(raw) == s.f.Null {
			return Field{Null: true}, nil
		}
		return Field{Value: unquoteCSV(raw, s.f.Quote, s.f.Escape)}, nil
	}
	if string(raw) == s.f.Null {
		return Field{Null: true}, nil
	}
	v, err := unescapeText(raw)
	return Field{Value: v}, err
}

// unquoteCSV removes CSV quoting: quoted stretches lose their quotes, and inside them
// an escape before a quote or an escape stands for that character.
func unquoteCSV(raw []byte, q, e byte) string {
	if !strings.ContainsRune(string(raw), rune(q)) {
		return string(raw)
	}
	var b strings.Builder
	in := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case in && c == e && i+1 < len(raw) && (raw[i+1] == q || raw[i+1] == e) && (e != q || raw[i+1] == q):
			b.WriteByte(raw[i+1])
			i++
		case c == q:
			in = !in
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// unescapeText decodes the backslash escapes of COPY's text format.
func unescapeText(raw []byte) (string, error) {
	if !strings.ContainsRune(string(raw), '\\') {
		return string(raw), nil
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(raw) {
			return "", errors.New("a row ends in a lone backslash")
		}
		c = raw[i]
		switch c {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case 'x':
			j := i + 1
			for j < len(raw) && j < i+3 && isHex(raw[j]) {
				j++
			}
			if j == i+1 {
				b.WriteByte('x')
				continue
			}
			n, _ := strconv.ParseUint(string(raw[i+1:j]), 16, 8)
			b.WriteByte(byte(n))
			i = j - 1
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(raw) && j < i+3 && raw[j] >= '0' && raw[j] <= '7' {
				j++
			}
			n, _ := strconv.ParseUint(string(raw[i:j]), 8, 16)
			b.WriteByte(byte(n))
			i = j - 1
		default:
			b.WriteByte(c) // \\ and any other character stand for themselves
		}
	}
	return b.String(), nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}
