package sqlplan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pganalyze/pg_query_go/v6/parser"
)

// SQLSTATE codes the planner answers with. Errors are *pgconn.PgError values, so that the
// wire proxy sends them to clients as they are and Go callers can read the code.
const (
	CodeFeatureNotSupported = "0A000" // a statement the sharding layer cannot answer exactly
	CodeSyntaxError         = "42601"
	CodeUndefinedTable      = "42P01"
	CodeUndefinedColumn     = "42703"
	CodeInvalidParameter    = "22023" // invalid_parameter_value: a key value of the wrong type
	CodeProtocolViolation   = "08P01"
	CodeInternalError       = "XX000"
)

// ErrUnsupported is matched (with errors.Is) by every refusal of the sharding layer.
var ErrUnsupported = errors.New("sqlplan: not supported across shards")

// refusal is a 0A000 error that also matches ErrUnsupported.
type refusal struct{ *pgconn.PgError }

func (r *refusal) Unwrap() []error { return []error{r.PgError, ErrUnsupported} }

// Unsupported refuses what the sharding layer cannot answer exactly, naming the
// construct and why, as SQLSTATE 0A000 with the message "shardlab: ...". Every refusal,
// from the planner, the engine, the driver or the proxy, is made by it, so that it
// matches ErrUnsupported.
func Unsupported(format string, args ...any) error { return unsupported(format, args...) }

// UnsupportedHint is Unsupported with a HINT: what to do instead.
func UnsupportedHint(hint, format string, args ...any) error {
	r := unsupported(format, args...).(*refusal)
	r.Hint = hint
	return r
}

// unsupported refuses a statement, naming the construct and why, as SQLSTATE 0A000.
func unsupported(format string, args ...any) error {
	return &refusal{&pgconn.PgError{
		Severity: "ERROR",
		Code:     CodeFeatureNotSupported,
		Message:  "shardlab: " + fmt.Sprintf(format, args...),
	}}
}

func pgErr(code, format string, args ...any) *pgconn.PgError {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: fmt.Sprintf(format, args...)}
}

// syntaxError turns a pg_query parse error into SQLSTATE 42601 with its position, as
// PostgreSQL reports it (1-based, in characters of the statement).
func syntaxError(err error) error {
	var pe *parser.Error
	if errors.As(err, &pe) {
		return &pgconn.PgError{Severity: "ERROR", Code: CodeSyntaxError, Message: pe.Message, Position: int32(pe.Cursorpos)}
	}
	return &pgconn.PgError{Severity: "ERROR", Code: CodeSyntaxError, Message: err.Error()}
}

// QuoteIdent quotes name as an SQL identifier: "name", with any double quote doubled.
func QuoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// UnquoteIdent is QuoteIdent's inverse, for messages that name an identifier as its
// user wrote it; a name that is not quoted is returned as it is.
func UnquoteIdent(quoted string) string {
	if len(quoted) < 2 || quoted[0] != '"' || quoted[len(quoted)-1] != '"' {
		return quoted
	}
	return strings.ReplaceAll(quoted[1:len(quoted)-1], `""`, `"`)
}

// Code returns the SQLSTATE of err, or "" when it carries none.
func Code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
