package loadgen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
)

// SQLStatements are the two statements an SQLTarget runs, in the placeholder syntax of
// the handle's driver ($1, $2 for PostgreSQL).
type SQLStatements struct {
	// Read takes the key as its one parameter and returns the value in the first column
	// of at most one row; no row is a miss.
	Read string
	// Write takes the key and the value and stores the value, replacing any earlier
	// one (an upsert).
	Write string
}

// SQLTarget drives a database/sql handle with point reads and upserts on a key-value
// table: whatever the handle reaches, one PostgreSQL database, the sharding driver, or a
// wire proxy through pgx's stdlib driver. Both statements are prepared once, when the
// target is made, so a missing table fails before the load starts.
type SQLTarget struct {
	read, write *sql.Stmt
}

var (
	_ Target          = (*SQLTarget)(nil)
	_ ErrorClassifier = (*SQLTarget)(nil)
)

// NewSQLTarget prepares st on db and returns the target. The caller keeps db; Close
// releases the prepared statements only. Cancelling ctx abandons the preparing.
func NewSQLTarget(ctx context.Context, db *sql.DB, st SQLStatements) (*SQLTarget, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil database handle", ErrBadConfig)
	}
	if st.Read == "" || st.Write == "" {
		return nil, fmt.Errorf("%w: an SQL target needs a read and a write statement", ErrBadConfig)
	}
	read, err := db.PrepareContext(ctx, st.Read)
	if err != nil {
		return nil, fmt.Errorf("loadgen: prepare read %q: %w", st.Read, err)
	}
	write, err := db.PrepareContext(ctx, st.Write)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("loadgen: prepare write %q: %w", st.Write, err), read.Close())
	}
	return &SQLTarget{read: read, write: write}, nil
}

// Read implements Target.
func (t *SQLTarget) Read(ctx context.Context, key string) (bool, error) {
	var value []byte
	err := t.read.QueryRowContext(ctx, key).Scan(&value)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Write implements Target.
func (t *SQLTarget) Write(ctx context.Context, key, value string) error {
	_, err := t.write.ExecContext(ctx, key, value)
	return err
}

// ClassifyError implements ErrorClassifier: "sqlstate_<code>" when the database answered
// with an SQLSTATE (pgx's *pgconn.PgError says it through a SQLState method), else
// ClassifyError's kinds.
func (t *SQLTarget) ClassifyError(err error) string {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		if code := state.SQLState(); code != "" {
			return "sqlstate_" + code
		}
	}
	return ClassifyError(err)
}

// Close releases the prepared statements and returns the first error.
func (t *SQLTarget) Close() error {
	return errors.Join(t.read.Close(), t.write.Close())
}

// tableName is what PostgresKV accepts: a plain, optionally schema-qualified name, so
// that it can go into statements unquoted (and folds to lower case as usual).
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// PostgresKV returns the statements for a PostgreSQL key-value table, and the DDL that
// creates it if it is absent:
//
//	CREATE TABLE IF NOT EXISTS <table> (key text PRIMARY KEY, value text NOT NULL)
//
// The write is INSERT ... ON CONFLICT (key) DO UPDATE. table is a plain identifier,
// optionally schema-qualified; anything else is refused with ErrBadConfig.
func PostgresKV(table string) (create string, st SQLStatements, err error) {
	if !tableName.MatchString(table) {
		return "", SQLStatements{}, fmt.Errorf("%w: table %q must be a plain name such as loadgen_kv or myschema.kv", ErrBadConfig, table)
	}
	create = fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (key text PRIMARY KEY, value text NOT NULL)`, table)
	st = SQLStatements{
		Read:  fmt.Sprintf(`SELECT value FROM %s WHERE key = $1`, table),
		Write: fmt.Sprintf(`INSERT INTO %s (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, table),
	}
	return create, st, nil
}
