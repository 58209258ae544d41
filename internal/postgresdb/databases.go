package postgresdb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CreateDatabase creates the database name on the server baseDSN points at, unless it
// exists, and returns baseDSN with its database replaced by name.
func CreateDatabase(ctx context.Context, baseDSN, name string) (string, error) {
	dsn, err := WithDatabase(baseDSN, name)
	if err != nil {
		return "", err
	}
	conn, err := connectAdmin(ctx, baseDSN)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := createDatabase(ctx, conn, name); err != nil {
		return "", err
	}
	return dsn, nil
}

// DropDatabase drops the database name, if it exists, on the server baseDSN points at
// (baseDSN must name another database), terminating the sessions still connected to it.
func DropDatabase(ctx context.Context, baseDSN, name string) error {
	conn, err := connectAdmin(ctx, baseDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return dropDatabase(ctx, conn, name)
}

// CreateDatabases creates the databases names that do not exist on the server baseDSN
// points at, through one connection, and returns those it created, on failure too.
// Creating concurrently with another session is safe: losing the race counts as
// "already exists", not as created. Cancelling ctx stops between databases.
func CreateDatabases(ctx context.Context, baseDSN string, names []string) (created []string, err error) {
	conn, err := connectAdmin(ctx, baseDSN)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, name := range names {
		made, err := createDatabase(ctx, conn, name)
		if made {
			created = append(created, name)
		}
		if err != nil {
			return created, err
		}
	}
	return created, nil
}

// DropDatabases drops the databases names that exist on the server baseDSN points at,
// through one connection, terminating the sessions still connected to them.
func DropDatabases(ctx context.Context, baseDSN string, names []string) error {
	conn, err := connectAdmin(ctx, baseDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, name := range names {
		if err := dropDatabase(ctx, conn, name); err != nil {
			return err
		}
	}
	return nil
}

// createDatabase creates name unless it exists and says whether it did. Losing a race
// with another session counts as success, but not as created.
func createDatabase(ctx context.Context, conn *pgx.Conn, name string) (created bool, err error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("postgres: look up database %s: %w", name, err)
	}
	if exists {
		return false, nil
	}
	// CREATE DATABASE cannot run inside a transaction block; Exec without arguments
	// sends it as a simple query, outside any.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		if IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("postgres: create database %s: %w", name, err)
	}
	return true, nil
}

func dropDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	q := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("postgres: drop database %s: %w", name, err)
	}
	return nil
}

func connectAdmin(ctx context.Context, baseDSN string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(baseDSN)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDSN, err)
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", RedactDSN(baseDSN), err)
	}
	return conn, nil
}
