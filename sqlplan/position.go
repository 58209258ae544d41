package sqlplan

import (
	"strings"
	"unicode/utf8"
)

// ClientPosition turns the position of a server's error in a statement the sharding
// layer sent (PostgreSQL's ErrorResponse position: 1-based, counted in characters) into
// the position of the same token in the client's statement, or 0 when it cannot tell.
//
// The statements a plan sends are the client's, rewritten: deparsed, tables renamed,
// columns added for a merge. The token the server points at is found in the client's
// text by what it says (an identifier as PostgreSQL reads it, any other token as
// written): it must occur there as many times as in the sent text, the one at the same
// rank, with the tokens before and after it the same in both. Anything else (a token the
// rewrite added, renamed or repeated) gives 0, no position, rather than a caret under
// the wrong word.
func ClientPosition(sent, client string, pos int) int {
	if sent == client {
		return pos
	}
	at := byteOffset(sent, pos)
	if pos <= 0 || at < 0 {
		return 0
	}
	st, ct := keyedTokens(sent), keyedTokens(client)
	i := tokenAt(st, at)
	if i < 0 {
		return 0
	}
	rank, count := 0, 0
	for k, t := range st {
		if t.key == st[i].key {
			if k < i {
				rank++
			}
			count++
		}
	}
	j := -1
	for k, t := range ct {
		if t.key != st[i].key {
			continue
		}
		if rank == 0 {
			j = k
		}
		rank--
		count--
	}
	if j < 0 || count != 0 {
		return 0
	}
	if neighbour(st, i-1) != neighbour(ct, j-1) || neighbour(st, i+1) != neighbour(ct, j+1) {
		return 0
	}
	off := ct[j].start
	if inner := at - st[i].start; inner > 0 && st[i].text == ct[j].text {
		off += inner // inside a token both texts spell alike (a string's bad byte)
	}
	return utf8.RuneCountInString(client[:off]) + 1
}

// keyedToken is a token with what it says: an identifier as PostgreSQL reads it
// (unquoted: in lower case; quoted: its name), anything else as written. The end of
// the text is a token too, with the key "", where "at end of input" errors point.
type keyedToken struct {
	key, text  string
	start, end int
}

func keyedTokens(sql string) []keyedToken {
	var out []keyedToken
	l := lexer{s: sql}
	for {
		t := l.next()
		text := sql[t.start:t.end]
		key := text
		switch t.kind {
		case tokIdent:
			key = strings.ToLower(text)
		case tokQuotedIdent:
			if len(text) >= 2 && text[0] == '"' && text[len(text)-1] == '"' {
				key = strings.ReplaceAll(text[1:len(text)-1], `""`, `"`)
			}
		case tokOp:
			if text == "!=" {
				key = "<>" // the same operator, which the deparser prints so
			}
		}
		out = append(out, keyedToken{key: key, text: text, start: t.start, end: t.end})
		if t.kind == tokEOF {
			return out
		}
	}
}

// tokenAt returns the index of the token holding byte offset at, or -1 when at falls
// between tokens (white space, a comment).
func tokenAt(ts []keyedToken, at int) int {
	for i, t := range ts {
		if at >= t.start && (at < t.end || t.start == t.end && at == t.start) {
			return i
		}
	}
	return -1
}

// neighbour is the key of token i, with a key of its own for before the first token.
func neighbour(ts []keyedToken, i int) string {
	if i < 0 {
		return "\x00start"
	}
	if i >= len(ts) {
		return "\x00end"
	}
	return ts[i].key
}

// byteOffset returns the byte offset of the 1-based character position pos in s; past
// the last character, len(s); -1 when pos is out of range.
func byteOffset(s string, pos int) int {
	if pos <= 0 {
		return -1
	}
	n := 1
	for i := range s {
		if n == pos {
			return i
		}
		n++
	}
	if n == pos {
		return len(s)
	}
	return -1
}

// Statement is one statement of a simple-protocol query string, with where it starts
// in that string (in characters: PostgreSQL counts an error's position from the
// string's start).
type Statement struct {
	SQL    string
	Offset int
}

// SplitStatementsAt splits a simple-protocol query string as SplitStatements does, and
// says where each statement starts in it.
func SplitStatementsAt(sql string) []Statement {
	out := splitStatementsAt(sql)
	for i := range out {
		out[i].Offset = utf8.RuneCountInString(sql[:out[i].Offset])
	}
	return out
}
