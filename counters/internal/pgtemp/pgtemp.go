// Package pgtemp creates throw-away PostgreSQL databases for tests and
// benchmarks, so that they never touch each other's tables.
package pgtemp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN is the environment variable that holds the DSN of the PostgreSQL
// server used by tests and benchmarks.
const EnvDSN = "SHARDLAB_PG_DSN"

// DefaultDSN is the server the benchmark uses when EnvDSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DB is a database made by [Create].
type DB struct {
	// Name is the database name.
	Name string
	// DSN connects to the new database with the credentials of the admin DSN.
	DSN string

	admin *pgx.ConnConfig
}

var namePrefixRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// Create connects to adminDSN (any database on the server, usually
// "postgres") and creates a new database named prefix_<random>. Cancelling
// ctx aborts it.
func Create(ctx context.Context, adminDSN, prefix string) (*DB, error) {
	if !namePrefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("pgtemp: bad database name prefix %q", prefix)
	}
	cfg, err := pgx.ParseConfig(adminDSN)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: parse DSN: %w", err)
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	name := prefix + "_" + hex.EncodeToString(r[:])
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("pgtemp: create database %s: %w", name, err)
	}
	dsn, err := withDatabase(adminDSN, name)
	if err != nil {
		return nil, err
	}
	return &DB{Name: name, DSN: dsn, admin: cfg}, nil
}

// Drop drops the database, disconnecting whoever still uses it (WITH
// (FORCE), PostgreSQL 13 or later). Cancelling ctx aborts it.
func (d *DB) Drop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, d.admin.Copy())
	if err != nil {
		return fmt.Errorf("pgtemp: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtemp: drop database %s: %w", d.Name, err)
	}
	return nil
}

// withDatabase rewrites dsn to connect to database name. Both URL and
// keyword/value DSNs are accepted: pgx lets a later dbname win in the
// keyword form, and the URL form has its path replaced.
func withDatabase(dsn, name string) (string, error) {
	if u, err := parseURL(dsn); err == nil && u != nil {
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}
