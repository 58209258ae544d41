package sqlplan

import (
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// A small lexer of PostgreSQL's lexical grammar (standard_conforming_strings on, as it
// has been by default since PostgreSQL 9.1). It never builds a parse tree: it is what
// lets the plan cache recognise a statement it has seen, with other literal values, in
// well under a microsecond, and it splits a simple-protocol string into statements.
// The parser proper is PostgreSQL's own (pg_query).

type tokKind uint8

const (
	tokEOF tokKind = iota
	tokIdent
	tokQuotedIdent
	tokString       // '...' (plain): a literal the cache may replace by a parameter
	tokNumber       // 42, 4.2, .5e3: likewise
	tokOtherLiteral // E'...', B'...', X'...', U&'...', N'...', $tag$...$tag$: kept as text
	tokParam        // $1
	tokOp           // operators, and any character the lexer does not know
	tokPunct        // ( ) [ ] , ; : . ::
)

type token struct {
	kind       tokKind
	start, end int
}

type lexer struct {
	s   string
	pos int
	// bad is set when a string, identifier or comment runs to the end of the input.
	bad bool
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func isIdentCont(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') || c == '$' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isOpChar(c byte) bool { return strings.IndexByte("+-*/<>=~!@#%^&|`?", c) >= 0 }

// next returns the next token, skipping white space and comments. An unterminated
// string, identifier or comment runs to the end of the input (the parser reports it).
func (l *lexer) next() token {
	s := l.s
	for l.pos < len(s) {
		c := s[l.pos]
		switch {
		case sqlSpace(rune(c)):
			l.pos++
		case c == '-' && l.pos+1 < len(s) && s[l.pos+1] == '-':
			// PostgreSQL ends such a comment at a carriage return too.
			for l.pos < len(s) && s[l.pos] != '\n' && s[l.pos] != '\r' {
				l.pos++
			}
		case c == '/' && l.pos+1 < len(s) && s[l.pos+1] == '*':
			depth := 0
			for l.pos < len(s) {
				if strings.HasPrefix(s[l.pos:], "/*") {
					depth++
					l.pos += 2
				} else if strings.HasPrefix(s[l.pos:], "*/") {
					depth--
					l.pos += 2
					if depth == 0 {
						break
					}
				} else {
					l.pos++
				}
			}
		default:
			return l.token()
		}
	}
	return token{kind: tokEOF, start: len(s), end: len(s)}
}

func (l *lexer) token() token {
	s, start := l.s, l.pos
	c := s[start]
	tok := func(k tokKind) token { return token{kind: k, start: start, end: l.pos} }
	switch {
	case c == '\'':
		l.quoted(start+1, '\'', false)
		return tok(tokString)
	case c == '"':
		l.quoted(start+1, '"', false)
		return tok(tokQuotedIdent)
	case (c == 'e' || c == 'E') && start+1 < len(s) && s[start+1] == '\'':
		l.quoted(start+2, '\'', true)
		return tok(tokOtherLiteral)
	case (c == 'b' || c == 'B' || c == 'x' || c == 'X' || c == 'n' || c == 'N') && start+1 < len(s) && s[start+1] == '\'':
		l.quoted(start+2, '\'', false)
		return tok(tokOtherLiteral)
	case (c == 'u' || c == 'U') && strings.HasPrefix(s[start+1:], "&'"):
		l.quoted(start+3, '\'', false)
		return tok(tokOtherLiteral)
	case (c == 'u' || c == 'U') && strings.HasPrefix(s[start+1:], "&\""):
		l.quoted(start+3, '"', false)
		return tok(tokQuotedIdent)
	case isIdentStart(c):
		l.pos++
		for l.pos < len(s) && isIdentCont(s[l.pos]) {
			l.pos++
		}
		return tok(tokIdent)
	case c == '$':
		if start+1 < len(s) && isDigit(s[start+1]) {
			l.pos++
			for l.pos < len(s) && isDigit(s[l.pos]) {
				l.pos++
			}
			return tok(tokParam)
		}
		// A dollar-quoted string: $tag$ ... $tag$, the tag an identifier without '$'.
		end := start + 1
		for end < len(s) && s[end] != '$' && isIdentCont(s[end]) {
			end++
		}
		if end < len(s) && s[end] == '$' && (end == start+1 || !isDigit(s[start+1])) {
			delim := s[start : end+1]
			if i := strings.Index(s[end+1:], delim); i >= 0 {
				l.pos = end + 1 + i + len(delim)
			} else {
				l.pos = len(s)
			}
			return tok(tokOtherLiteral)
		}
		l.pos++
		return tok(tokOp)
	case isDigit(c) || (c == '.' && start+1 < len(s) && isDigit(s[start+1])):
		l.number()
		return tok(tokNumber)
	case c == ':' && start+1 < len(s) && s[start+1] == ':':
		l.pos += 2
		return tok(tokPunct)
	case strings.IndexByte("()[],;:.", c) >= 0:
		l.pos++
		return tok(tokPunct)
	case isOpChar(c):
		l.pos++
		for l.pos < len(s) && isOpChar(s[l.pos]) && !strings.HasPrefix(s[l.pos:], "--") && !strings.HasPrefix(s[l.pos:], "/*") {
			l.pos++
		}
		return tok(tokOp)
	default:
		l.pos++
		return tok(tokOp)
	}
}

// quoted advances past a quoted string or identifier whose body starts at from. A
// doubled quote is an escaped quote; with backslashes, a backslash escapes the next byte.
func (l *lexer) quoted(from int, q byte, backslashes bool) {
	s := l.s
	i := from
	for i < len(s) {
		switch {
		case backslashes && s[i] == '\\':
			i += 2
		case s[i] == q:
			if i+1 < len(s) && s[i+1] == q {
				i += 2
				continue
			}
			l.pos = i + 1
			return
		default:
			i++
		}
	}
	l.pos = len(s)
	l.bad = true
}

func (l *lexer) number() {
	s := l.s
	for l.pos < len(s) && isDigit(s[l.pos]) {
		l.pos++
	}
	// A '.' followed by another '.' is a range operator in some contexts, never a decimal.
	if l.pos < len(s) && s[l.pos] == '.' && !(l.pos+1 < len(s) && s[l.pos+1] == '.') {
		l.pos++
		for l.pos < len(s) && isDigit(s[l.pos]) {
			l.pos++
		}
	}
	if l.pos < len(s) && (s[l.pos] == 'e' || s[l.pos] == 'E') {
		j := l.pos + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			l.pos = j
			for l.pos < len(s) && isDigit(s[l.pos]) {
				l.pos++
			}
		}
	}
}

// keywordIs reports whether an unquoted identifier token spells kw (lower-case).
func keywordIs(s string, t token, kw string) bool {
	return t.kind == tokIdent && t.end-t.start == len(kw) && strings.EqualFold(s[t.start:t.end], kw)
}

// literalFollows lists the keywords after which a plain literal is a value, so that
// replacing it by a parameter keeps the statement's grammar. After any other word (a
// type name, as in DATE '2024-01-01' or INTERVAL '1 day'), the literal is kept in the
// statement's text.
var literalFollows = map[string]bool{
	"select": true, "where": true, "and": true, "or": true, "not": true, "then": true, "else": true,
	"when": true, "like": true, "ilike": true, "on": true, "having": true, "limit": true, "offset": true,
	"between": true, "case": true, "default": true, "escape": true, "to": true, "returning": true,
	"set": true, "values": true, "in": true, "is": true, "all": true, "any": true, "some": true,
	"distinct": true, "by": true, "first": true, "next": true,
}

// maxLiterals caps how many literals a statement may have to be normalised; a bulk
// INSERT with thousands of values is planned each time rather than filling the cache.
const maxLiterals = 256

// normalize replaces each plain string and number literal of a simple-protocol
// statement by $1, $2 ... in order, appending the result, then a NUL and one letter per
// literal kind ('s' string, 'n' number), to key. It returns the extended key and the
// literals, and ok false when the statement already has $n parameters or too many
// literals, or cannot be normalised safely; the caller then plans the text as it is.
func normalize(key []byte, sql string, lits []Literal) ([]byte, []Literal, bool) {
	l := lexer{s: sql}
	last := 0
	prev := token{kind: tokEOF}
	for {
		t := l.next()
		if t.kind == tokEOF {
			break
		}
		switch t.kind {
		case tokParam:
			return key, lits, false
		case tokString, tokNumber:
			if !literalPosition(sql, prev) {
				break
			}
			if len(lits) == maxLiterals {
				return key, lits, false
			}
			lits = append(lits, Literal{Start: t.start, End: t.end, String: t.kind == tokString})
			key = append(key, sql[last:t.start]...)
			key = append(key, '$')
			key = strconv.AppendInt(key, int64(len(lits)), 10)
			last = t.end
		}
		prev = t
	}
	if l.bad {
		return key, lits, false // let the parser report the unterminated literal
	}
	key = append(key, sql[last:]...)
	key = append(key, 0)
	for _, lit := range lits {
		if lit.String {
			key = append(key, 's')
		} else {
			key = append(key, 'n')
		}
	}
	return key, lits, true
}

// literalPosition reports whether a literal after token prev stands where any value
// expression may.
func literalPosition(sql string, prev token) bool {
	switch prev.kind {
	case tokOp:
		return true
	case tokPunct:
		p := sql[prev.start:prev.end]
		return p == "(" || p == "," || p == "["
	case tokIdent:
		w := sql[prev.start:prev.end]
		if len(w) > 9 {
			return false
		}
		var b [9]byte
		for i := range len(w) {
			c := w[i]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			b[i] = c
		}
		return literalFollows[string(b[:len(w)])]
	}
	return false
}

// splitStatements returns the statements of a simple-protocol query string as
// PostgreSQL's grammar reads them. A string with no semicolon before its end is one
// statement, found by the lexer alone (the common case, which pays no parse). One with
// several semicolons is split by the parser, which knows that a semicolon inside
// BEGIN ATOMIC ... END or CREATE RULE ... DO (...; ...) does not end the statement; a
// string the parser refuses is returned whole, so that planning it reports the syntax
// error where PostgreSQL does, and nothing of it runs, as in PostgreSQL.
func splitStatements(sql string) []string {
	parts := splitStatementsAt(sql)
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.SQL
	}
	return out
}

// splitStatementsAt is splitStatements, with each statement's start in sql (a byte
// offset here; SplitStatementsAt counts characters).
func splitStatementsAt(sql string) []Statement {
	if one, ok := oneStatement(sql); ok {
		return one
	}
	return lexedStatementsAt(sql)
}

// oneStatement answers splitStatementsAt without lexing the whole string when sql holds
// no semicolon, or one that ends it: then it is one statement, or none when nothing but
// white space and comments stands before that semicolon. Every simple-protocol query of
// one statement takes this path, on the proxy's hot path. A semicolon inside a
// comment or an unterminated string changes nothing: the lexer would find no end
// before it either.
func oneStatement(sql string) ([]Statement, bool) {
	body := sql
	switch strings.Count(sql, ";") {
	case 0:
	case 1:
		end := strings.TrimRightFunc(sql, sqlSpace)
		if !strings.HasSuffix(end, ";") {
			return nil, false
		}
		body = end[:len(end)-1]
	default:
		return nil, false
	}
	if b := strings.TrimFunc(body, sqlSpace); b == "" || onlyComments(b) { // as lexerSplit trims
		return nil, true
	}
	return []Statement{trimmed(sql, 0)}, true
}

// lexedStatementsAt is splitStatementsAt by the lexer, and by the parser when the
// lexer finds several statements.
func lexedStatementsAt(sql string) []Statement {
	parts := lexerSplit(sql)
	if len(parts) == 1 {
		// One statement: as the client sent it, its semicolon and trailing comments
		// included, so that a syntax error names the place PostgreSQL names ("at or
		// near \";\"") and its position counts in the client's string.
		return []Statement{trimmed(sql, 0)}
	}
	if len(parts) == 0 {
		return nil
	}
	stmts, err := pg.SplitWithParser(sql, false)
	if err != nil {
		return []Statement{trimmed(sql, 0)}
	}
	var out []Statement
	from := 0
	for _, st := range stmts {
		at := statementStart(sql, from, st)
		if at < 0 {
			return []Statement{trimmed(sql, 0)} // not a part of sql: cannot happen
		}
		from = at + len(st)
		if t := trimmed(st, at); t.SQL != "" && !onlyComments(t.SQL) {
			out = append(out, t)
		}
	}
	return out
}

// statementStart returns where the parser's statement st starts in sql, at or past
// from: at the start of sql, or right after a semicolon outside quotes and comments
// (PostgreSQL's statements begin there, white space and comments included). An empty
// statement before it (";;", "; /* x */ ;") begins with a semicolon, which st cannot.
func statementStart(sql string, from int, st string) int {
	if from == 0 && strings.HasPrefix(sql, st) {
		return 0
	}
	l := lexer{s: sql, pos: from}
	for {
		t := l.next()
		if t.kind == tokEOF {
			return -1
		}
		if t.kind == tokPunct && sql[t.start:t.end] == ";" && strings.HasPrefix(sql[t.end:], st) {
			return t.end
		}
	}
}

// trimmed is s without surrounding white space, s starting at byte at of its string.
func trimmed(s string, at int) Statement {
	t := strings.TrimLeftFunc(s, sqlSpace)
	return Statement{SQL: strings.TrimRightFunc(t, sqlSpace), Offset: at + len(s) - len(t)}
}

// lexerSplit splits sql at every semicolon outside quotes and comments.
func lexerSplit(sql string) []string {
	var out []string
	l := lexer{s: sql}
	start := 0
	for {
		t := l.next()
		if t.kind == tokEOF || (t.kind == tokPunct && sql[t.start:t.end] == ";") {
			if stmt := strings.TrimFunc(sql[start:t.start], sqlSpace); stmt != "" && !onlyComments(stmt) {
				out = append(out, stmt)
			}
			if t.kind == tokEOF {
				return out
			}
			start = t.end
		}
	}
}

// sqlSpace reports whether r is white space to PostgreSQL's scanner: ASCII space, tab,
// newline, carriage return, form feed and vertical tab. Other white space (U+00A0 and
// the like) is part of an identifier there, so a statement with it is an error, never
// trimmed away.
func sqlSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v'
}

func onlyComments(s string) bool {
	l := lexer{s: s}
	return l.next().kind == tokEOF
}

// Tokens returns the text of every token of sql (comments and white space left out).
func Tokens(sql string) []string {
	var out []string
	l := lexer{s: sql}
	for {
		t := l.next()
		if t.kind == tokEOF {
			return out
		}
		out = append(out, sql[t.start:t.end])
	}
}

// NumberedParams rewrites the $n parameters of sql with another prefix (SQLite
// numbers its parameters ?n), leaving strings, identifiers and comments alone.
func NumberedParams(sql, prefix string) string {
	var b strings.Builder
	l := lexer{s: sql}
	last := 0
	for {
		t := l.next()
		if t.kind == tokEOF {
			break
		}
		if t.kind == tokParam {
			b.WriteString(sql[last:t.start])
			b.WriteString(prefix)
			b.WriteString(sql[t.start+1 : t.end])
			last = t.end
		}
	}
	if last == 0 {
		return sql
	}
	b.WriteString(sql[last:])
	return b.String()
}
