package sqlplan

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// statementSQL names every statement type of PostgreSQL's grammar (pg_query's parse
// node, without its "Stmt") as SQL writes it, for refusals that say which statement they
// refuse. docs/sql-sharding.md ("Every statement type") says what becomes of each over
// several shards; TestEveryStatementTypeIsDecided keeps both complete when the grammar
// grows.
var statementSQL = map[string]string{
	"Raw": "(a parsed statement's wrapper)", "SetOperation": "UNION, INTERSECT, EXCEPT",
	"Return": "RETURN (inside SQL functions)", "PLAssign": "assignment (inside PL/pgSQL)",
	"Select": "SELECT", "Insert": "INSERT", "Update": "UPDATE", "Delete": "DELETE", "Merge": "MERGE",
	"Copy": "COPY", "Explain": "EXPLAIN", "Lock": "LOCK",
	"Transaction": "BEGIN, COMMIT, ROLLBACK, SAVEPOINT, PREPARE TRANSACTION",
	"VariableSet": "SET, RESET", "VariableShow": "SHOW", "Discard": "DISCARD",
	"ConstraintsSet": "SET CONSTRAINTS",
	"Listen":         "LISTEN", "Unlisten": "UNLISTEN", "Notify": "NOTIFY",
	"Do": "DO", "Call": "CALL", "Prepare": "PREPARE", "Execute": "EXECUTE", "Deallocate": "DEALLOCATE",
	"DeclareCursor": "DECLARE", "Fetch": "FETCH, MOVE", "ClosePortal": "CLOSE",
	"Create": "CREATE TABLE", "CreateTableAs": "CREATE TABLE AS, SELECT INTO, CREATE MATERIALIZED VIEW",
	"AlterTable": "ALTER TABLE, ALTER INDEX, ALTER SEQUENCE, ALTER VIEW", "ReplicaIdentity": "ALTER TABLE ... REPLICA IDENTITY",
	"Rename": "ALTER ... RENAME", "Drop": "DROP", "Truncate": "TRUNCATE", "Index": "CREATE INDEX",
	"View": "CREATE VIEW", "RefreshMatView": "REFRESH MATERIALIZED VIEW", "Vacuum": "VACUUM, ANALYZE",
	"Cluster": "CLUSTER", "Reindex": "REINDEX", "CheckPoint": "CHECKPOINT", "Load": "LOAD",
	"Comment": "COMMENT", "SecLabel": "SECURITY LABEL", "Grant": "GRANT, REVOKE",
	"GrantRole": "GRANT role, REVOKE role", "AlterDefaultPrivileges": "ALTER DEFAULT PRIVILEGES",
	"CreateRole": "CREATE ROLE", "AlterRole": "ALTER ROLE", "AlterRoleSet": "ALTER ROLE ... SET",
	"DropRole": "DROP ROLE", "DropOwned": "DROP OWNED", "ReassignOwned": "REASSIGN OWNED",
	"CreateSchema": "CREATE SCHEMA", "CreateExtension": "CREATE EXTENSION", "AlterExtension": "ALTER EXTENSION ... UPDATE",
	"AlterExtensionContents": "ALTER EXTENSION ... ADD, DROP", "CreateFunction": "CREATE FUNCTION, CREATE PROCEDURE",
	"AlterFunction": "ALTER FUNCTION, ALTER PROCEDURE", "CreateSeq": "CREATE SEQUENCE", "AlterSeq": "ALTER SEQUENCE",
	"Define": "CREATE AGGREGATE, OPERATOR, TYPE, COLLATION, TEXT SEARCH ...", "CompositeType": "CREATE TYPE ... AS",
	"CreateEnum": "CREATE TYPE ... AS ENUM", "AlterEnum": "ALTER TYPE ... ADD VALUE", "CreateRange": "CREATE TYPE ... AS RANGE",
	"CreateDomain": "CREATE DOMAIN", "AlterDomain": "ALTER DOMAIN", "AlterType": "ALTER TYPE ... SET",
	"AlterCollation": "ALTER COLLATION", "CreateCast": "CREATE CAST", "CreateConversion": "CREATE CONVERSION",
	"CreateTransform": "CREATE TRANSFORM", "CreateOpClass": "CREATE OPERATOR CLASS", "CreateOpFamily": "CREATE OPERATOR FAMILY",
	"AlterOpFamily": "ALTER OPERATOR FAMILY", "AlterOperator": "ALTER OPERATOR",
	"AlterTSDictionary": "ALTER TEXT SEARCH DICTIONARY", "AlterTSConfiguration": "ALTER TEXT SEARCH CONFIGURATION",
	"CreatePLang": "CREATE LANGUAGE", "CreateAm": "CREATE ACCESS METHOD",
	"CreateTrig": "CREATE TRIGGER", "CreateEventTrig": "CREATE EVENT TRIGGER", "AlterEventTrig": "ALTER EVENT TRIGGER",
	"Rule": "CREATE RULE", "CreatePolicy": "CREATE POLICY", "AlterPolicy": "ALTER POLICY",
	"CreateStats": "CREATE STATISTICS", "AlterStats": "ALTER STATISTICS",
	"AlterOwner": "ALTER ... OWNER TO", "AlterObjectSchema": "ALTER ... SET SCHEMA", "AlterObjectDepends": "ALTER ... DEPENDS ON EXTENSION",
	"CreateFdw": "CREATE FOREIGN DATA WRAPPER", "AlterFdw": "ALTER FOREIGN DATA WRAPPER",
	"CreateForeignServer": "CREATE SERVER", "AlterForeignServer": "ALTER SERVER",
	"CreateUserMapping": "CREATE USER MAPPING", "AlterUserMapping": "ALTER USER MAPPING", "DropUserMapping": "DROP USER MAPPING",
	"CreateForeignTable": "CREATE FOREIGN TABLE", "ImportForeignSchema": "IMPORT FOREIGN SCHEMA",
	"CreateTableSpace": "CREATE TABLESPACE", "DropTableSpace": "DROP TABLESPACE",
	"AlterTableSpaceOptions": "ALTER TABLESPACE", "AlterTableMoveAll": "ALTER TABLE ALL IN TABLESPACE",
	"Createdb": "CREATE DATABASE", "AlterDatabase": "ALTER DATABASE", "AlterDatabaseSet": "ALTER DATABASE ... SET",
	"AlterDatabaseRefreshColl": "ALTER DATABASE ... REFRESH COLLATION VERSION", "Dropdb": "DROP DATABASE",
	"AlterSystem": "ALTER SYSTEM", "CreatePublication": "CREATE PUBLICATION", "AlterPublication": "ALTER PUBLICATION",
	"CreateSubscription": "CREATE SUBSCRIPTION", "AlterSubscription": "ALTER SUBSCRIPTION", "DropSubscription": "DROP SUBSCRIPTION",
}

// nodeType is the name of a parse node's type in pg_query's protocol buffers:
// "ReindexStmt".
func nodeType(n *pg.Node) string {
	m := n.ProtoReflect()
	f := m.WhichOneof(m.Descriptor().Oneofs().Get(0))
	if f == nil || f.Message() == nil {
		return fmt.Sprintf("%T", n.Node)
	}
	return string(f.Message().Name())
}

// statementName names a statement as SQL writes it: "REINDEX".
func statementName(n *pg.Node) string {
	t := nodeType(n)
	if name, ok := statementSQL[strings.TrimSuffix(t, "Stmt")]; ok {
		return name
	}
	return t
}

// refusedOverShards says why a statement type is refused over several shards (rules of
// one shard pass it through); "" for the types the default reason covers.
var refusedOverShards = map[string]string{
	"Merge":                    "MERGE over several shards; use INSERT ... ON CONFLICT, UPDATE and DELETE",
	"Reindex":                  "REINDEX over several shards; run it on each shard",
	"Cluster":                  "CLUSTER over several shards; run it on each shard",
	"RefreshMatView":           "REFRESH MATERIALIZED VIEW over several shards (materialized views are per shard); run it on each shard",
	"Load":                     "LOAD over several shards (a library loaded into one server session); set shared_preload_libraries or session_preload_libraries on the shards",
	"ConstraintsSet":           "SET CONSTRAINTS over several shards; declare the constraints INITIALLY DEFERRED or IMMEDIATE",
	"CreateForeignTable":       "CREATE FOREIGN TABLE over several shards; create it on the shard that should hold it",
	"ImportForeignSchema":      "IMPORT FOREIGN SCHEMA over several shards; run it on the shard that should hold the tables",
	"CreateTableSpace":         "CREATE TABLESPACE through the sharding layer (a directory of one server); run it on each server",
	"DropTableSpace":           "DROP TABLESPACE through the sharding layer (a directory of one server); run it on each server",
	"AlterTableSpaceOptions":   "ALTER TABLESPACE through the sharding layer (a directory of one server); run it on each server",
	"AlterTableMoveAll":        "ALTER TABLE ALL IN TABLESPACE over several shards; run it on each server",
	"Createdb":                 "CREATE DATABASE through the sharding layer (it serves one logical database); run it on the servers",
	"Dropdb":                   "DROP DATABASE through the sharding layer (it serves one logical database); run it on the servers",
	"AlterDatabase":            "ALTER DATABASE through the sharding layer (each shard is a database of its own); run it on the servers",
	"AlterDatabaseSet":         "ALTER DATABASE ... SET through the sharding layer (each shard is a database of its own); run it on the servers",
	"AlterDatabaseRefreshColl": "ALTER DATABASE ... REFRESH COLLATION VERSION through the sharding layer; run it on the servers",
	"AlterSystem":              "ALTER SYSTEM through the sharding layer (one server's configuration); run it on each server",
	"CreatePublication":        "CREATE PUBLICATION over several shards (logical replication is per server); run it on each shard",
	"AlterPublication":         "ALTER PUBLICATION over several shards (logical replication is per server); run it on each shard",
	"CreateSubscription":       "CREATE SUBSCRIPTION over several shards (logical replication is per server); run it on each shard",
	"AlterSubscription":        "ALTER SUBSCRIPTION over several shards (logical replication is per server); run it on each shard",
	"DropSubscription":         "DROP SUBSCRIPTION over several shards (logical replication is per server); run it on each shard",
}
