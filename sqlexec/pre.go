package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// An UPDATE or DELETE whose subqueries over sharded tables span shards (sqlplan.Pre),
// the part both adapters share: each subquery is evaluated alone, through the
// adapter's usual paths, and its answer becomes a parameter of the statement, which
// then runs without it. The adapters differ in how they read a subquery's answer
// (their sessions, or the coordinator database) and hold the statement's transaction
// (PreSteps).

// PreSteps are what an adapter lends RunPre.
type PreSteps struct {
	// Prepare plans a statement in the session's view of the schema.
	Prepare func(ctx context.Context, sql string) (*sqlplan.Plan, error)
	// Rows reads a bound subquery's answer whole, in binary: its column types and rows
	// (the first only, with first).
	Rows func(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, first bool) ([]uint32, [][][]byte, error)
	// OwnCollation reports whether a column of tables carries a collation of its own.
	OwnCollation func(ctx context.Context, tables []string) (bool, error)
	// Domains reports whether a column of tables is of a domain.
	Domains func(ctx context.Context, tables []string) (bool, error)
	// Begin opens the statement's own transaction, when the session has none: the
	// subqueries the coordinator answers are read before it (they read outside any).
	Begin func() error
	// End ends the transaction Begin opened, committing it if commit.
	End func(ctx context.Context, commit bool) error
	// Execute runs the bound statement in the session.
	Execute func(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16) (*Result, error)
	// Failure decides what the program sees of a subquery's failure (see PreFailure).
	Failure func(ctx context.Context, err error) error
}

// RunPre runs plan, an UPDATE or DELETE that Bind refused (refused) over several
// shards, whose subqueries are evaluated first (plan.Pre, planned from the statement's
// own text). args are its parameters, typed paramOIDs as it was described.
func (e *Engine) RunPre(ctx context.Context, plan *sqlplan.Plan, refused error, args sqlplan.Args, paramOIDs []uint32, resultFormats []int16, steps PreSteps) (res *Result, err error) {
	pre := plan.Pre
	n := len(pre.Subqueries)
	bound := make([]*sqlplan.Bound, n)
	subArgs := make([]sqlplan.Args, n)
	for i, sub := range pre.Subqueries {
		qp, err := steps.Prepare(ctx, sub.SQL)
		if err != nil {
			return nil, steps.Failure(ctx, err)
		}
		if qp.Kind != sqlplan.KindSelect && qp.Kind != sqlplan.KindCoordinator {
			return nil, refused
		}
		subArgs[i] = FirstArgs(args, paramOIDs, qp.NumParams)
		if bound[i], err = qp.Bind(subArgs[i]); err != nil {
			return nil, steps.Failure(ctx, err)
		}
	}
	values := make([][][]byte, n) // by subquery, its parameters' values
	oids := make([][]uint32, n)
	evaluate := func(i int) error {
		sub := pre.Subqueries[i]
		cols, rows, err := steps.Rows(ctx, bound[i], subArgs[i], sub.Kind == sqlplan.SubqueryExists)
		if err != nil {
			return steps.Failure(ctx, err)
		}
		if sub.Kind != sqlplan.SubqueryExists {
			// A domain's value arrives as its base type's: as a parameter it would be
			// checked against the domain again where it is assigned (a subquery of no
			// row into a NOT NULL domain column is NULL on one database, 23502 here).
			domains, err := steps.Domains(ctx, bound[i].Plan.Tables)
			if err != nil {
				return err
			}
			if domains {
				return sqlplan.Unsupported("%s; a subquery over sharded tables that have a column of a domain type is not evaluated first (its values would be read as the base type's)", refusalText(refused))
			}
		}
		compared := sub.Kind != sqlplan.SubqueryExists && len(cols) == 1 && collatable(cols[0])
		if sub.Kind == sqlplan.SubqueryColumns {
			compared = slices.ContainsFunc(cols, collatable)
		}
		if compared {
			// One database compares with the subquery column's collation when it has
			// one of its own; a parameter has its type's.
			own := sub.Collates
			if !own {
				if own, err = steps.OwnCollation(ctx, bound[i].Plan.Tables); err != nil {
					return err
				}
			}
			if own {
				return sqlplan.Unsupported("%s; a subquery over sharded tables whose text column may carry a collation of its own (COLLATE, or a column's) is not evaluated first", refusalText(refused))
			}
		}
		if sub.Kind == sqlplan.SubqueryColumns {
			values[i], oids[i], err = columnValues(sub, cols, rows)
			return err
		}
		v, oid, err := subqueryValue(sub.Kind, cols, rows)
		values[i], oids[i] = [][]byte{v}, []uint32{oid}
		return err
	}
	for i := range n {
		if bound[i].Coordinated() {
			if err := evaluate(i); err != nil {
				return nil, err
			}
		}
	}
	if steps.Begin != nil {
		if err := steps.Begin(); err != nil {
			return nil, err
		}
		defer func() {
			p := recover()
			if end := steps.End(ctx, err == nil && p == nil); err == nil && end != nil {
				res, err = nil, end
			}
			if p != nil {
				panic(p) // after its transaction rolled back
			}
		}()
	}
	for i := range n {
		if !bound[i].Coordinated() {
			if err := evaluate(i); err != nil {
				return nil, err
			}
		}
	}
	wargs := FirstArgs(args, paramOIDs, pre.Params)
	for i := range values {
		wargs.Values = append(wargs.Values, values[i]...)
		wargs.OIDs = append(wargs.OIDs, oids[i]...)
		for range values[i] {
			wargs.Formats = append(wargs.Formats, 1)
		}
	}
	wp, err := steps.Prepare(ctx, pre.SQL)
	if err != nil {
		return nil, err
	}
	b, err := wp.Bind(wargs)
	if err != nil {
		return nil, err
	}
	return steps.Execute(ctx, b, wargs, resultFormats)
}

// refusalText is a refusal's message without the project's prefix.
func refusalText(refused error) string {
	var pe *pgconn.PgError
	if errors.As(refused, &pe) {
		return strings.TrimPrefix(pe.Message, "shardlab: ")
	}
	if refused == nil {
		return "a construct exact on one shard only, over several shards"
	}
	return strings.TrimPrefix(refused.Error(), "shardlab: ")
}

// collatable reports whether a value of a built-in type compares under a collation
// (text's, varchar's and bpchar's the default one, name's C), which a column may
// declare otherwise and a parameter cannot.
func collatable(oid uint32) bool {
	const oidText, oidVarchar, oidBpchar, oidName = 25, 1043, 1042, 19
	return oid == oidText || oid == oidVarchar || oid == oidBpchar || oid == oidName
}

// subqueryValue is what a subquery's answer becomes in the statement: a parameter's
// value, in binary, and its type.
func subqueryValue(kind sqlplan.SubqueryKind, cols []uint32, rows [][][]byte) ([]byte, uint32, error) {
	const oidBool = 16
	if kind == sqlplan.SubqueryExists {
		if len(rows) > 0 {
			return []byte{1}, oidBool, nil
		}
		return []byte{0}, oidBool, nil
	}
	if len(cols) != 1 {
		if kind == sqlplan.SubqueryScalar {
			return nil, 0, &pgconn.PgError{Severity: "ERROR", Code: "42601", Message: "subquery must return only one column"}
		}
		return nil, 0, &pgconn.PgError{Severity: "ERROR", Code: "42601", Message: "subquery has too many columns"}
	}
	if cols[0] == oidRecord {
		// ROW(...): an anonymous record, which the server cannot read back as a
		// parameter, and whose IS NULL differs from its = (every field NULL).
		return nil, 0, sqlplan.Unsupported("a subquery over several shards whose column is an anonymous record (ROW(...)); compare its fields one by one")
	}
	if cols[0] >= 16384 {
		return nil, 0, sqlplan.Unsupported("a subquery over several shards whose column is of a type the database defines (OID %d), which other data sources number differently; cast it to a built-in type", cols[0])
	}
	if kind == sqlplan.SubqueryScalar {
		switch len(rows) {
		case 0:
			return nil, cols[0], nil
		case 1:
			return rows[0][0], cols[0], nil
		}
		// One database raises 21000 only if it evaluates the subquery, which it may
		// not (no row to update): refused rather than an error it might not raise.
		return nil, 0, sqlplan.Unsupported("a subquery over several shards used as an expression returned more than one row")
	}
	values := make([][]byte, len(rows))
	for i, r := range rows {
		values[i] = r[0]
	}
	array, oid, ok := BinaryArray(cols[0], values)
	if !ok {
		return nil, 0, sqlplan.Unsupported("a subquery over several shards compared with ANY, ALL or IN, of a type (OID %d) whose array is not written", cols[0])
	}
	return array, oid, nil
}

// exactSum are the types whose sum (and avg) is the same in any order of addition,
// and cannot overflow in one order but not another: int2, int4, int8 (added as int8
// or numeric) and numeric. Not money or interval: their sums overflow midway.
var exactSum = map[uint32]bool{21: true, 23: true, 20: true, 1700: true}

// alikeWhenEqual are the types whose values that compare equal are the same value (a
// numeric's 1.0 and 1.00 are not; nor are an interval's '1 day' and '24 hours'):
// bool, int2, int4, int8, text, varchar, date, timestamp, timestamptz, uuid, oid, money.
var alikeWhenEqual = map[uint32]bool{16: true, 21: true, 23: true, 20: true, 25: true, 1043: true, 1082: true, 1114: true,
	1184: true, 2950: true, 26: true, 790: true}

// columnValues are the parameters of a correlated subquery's first step
// (sqlplan.SubqueryColumns): each column's values, in the rows' order, as an array.
func columnValues(sub sqlplan.Subquery, cols []uint32, rows [][][]byte) ([][]byte, []uint32, error) {
	if len(cols) != sub.Params {
		return nil, nil, fmt.Errorf("sqlexec: a correlated subquery's first step answered %d columns, not %d", len(cols), sub.Params)
	}
	for _, c := range sub.Summed {
		if !exactSum[cols[c]] {
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards that adds values of a type (OID %d) whose sum may depend on the order of addition (sum, avg): one database adds them in another order; cast them to numeric", cols[c])
		}
	}
	for _, c := range sub.Bounded {
		if cols[c] == oidNumeric {
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards, grouped or in WHERE, that adds numeric values computed first (sum, avg): a sum past 1e131072 fails, and one database finishes its groups, or evaluates the subquery for the rows, in another order; sum a column of a precision, numeric(p, s), or integers")
		}
	}
	for _, c := range sub.Picked {
		if !alikeWhenEqual[cols[c]] {
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards that picks one of equal values of a type (OID %d) whose equal values may differ (min, max, DISTINCT in an aggregate, a column selected and sorted by under a limit): one database reads the rows in another order", cols[c])
		}
	}
	values := make([][]byte, len(cols))
	oids := make([]uint32, len(cols))
	column := make([][]byte, len(rows))
	for c, oid := range cols {
		switch {
		case oid == oidRecord:
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards that reads an anonymous record (ROW(...)); compare its fields one by one")
		case oid >= 16384:
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards that reads a column of a type the database defines (OID %d), which other data sources number differently", oid)
		}
		for r, row := range rows {
			column[r] = row[c]
		}
		array, at, ok := BinaryArray(oid, column)
		if !ok {
			return nil, nil, sqlplan.Unsupported("a correlated subquery over several shards that reads a column of a type (OID %d) whose array is not written", oid)
		}
		values[c], oids[c] = array, at
	}
	return values, oids, nil
}

// PreFailure decides what a program sees when a subquery of plan (refused as it
// stands: refused), evaluated alone, failed with err. An error of its analysis (class
// 42) may say that it names the statement's columns (correlated): the whole statement
// is then described by describe on a data source (plan.DescribeSQL), whose error is
// one database's answer; when it has none, the statement is refused. A data error (a
// division by zero, class 22) could come from a subquery one database never evaluates
// (no row needs it): refused too. Other errors (a cancel, a lost connection, a
// deadlock) are the statement's.
func PreFailure(refused error, err error, describe func(ds int, sql string) error, plan *sqlplan.Plan) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	why := refusalText(refused)
	switch {
	case strings.HasPrefix(pe.Code, "42") && pe.Code != "42P01" && pe.Code != "42703" && pe.Code != "42501":
		// An error found while the subquery ran (no equality for an array's elements,
		// 42883; two collations compared, 42P22) that one database, describing the whole
		// statement, does not raise: it would raise it only if it evaluated the subquery.
		oneDB := describe(plan.DescribeSQL())
		var one *pgconn.PgError
		if errors.As(oneDB, &one) && one.Code != "42P18" {
			return oneDB
		}
		return sqlplan.Unsupported("%s; a subquery over sharded tables evaluated first failed (%s: %s), where one database might not evaluate it", why, pe.Code, pe.Message)
	case pe.Code == "42P01" || pe.Code == "42703":
		// What a reference to the statement's tables or columns gives alone.
		oneDB := describe(plan.DescribeSQL())
		var one *pgconn.PgError
		if errors.As(oneDB, &one) && one.Code != "42P18" {
			return oneDB
		}
		return sqlplan.Unsupported("%s; a subquery over sharded tables that names the statement's own columns (correlated) is not evaluated first", why)
	case strings.HasPrefix(pe.Code, "22") || pe.Code == "21000":
		return sqlplan.Unsupported("%s; a subquery over sharded tables evaluated first failed (%s: %s), where one database might not evaluate it", why, pe.Code, pe.Message)
	case pe.Code == "0A000":
		return sqlplan.Unsupported("%s; a subquery over sharded tables cannot be evaluated first: %s", why, strings.TrimPrefix(pe.Message, "shardlab: "))
	}
	return err
}
