package proxy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/auth"
)

// TestSCRAM: with a users file, clients authenticate with SCRAM-SHA-256 (pgx and
// libpq's psql); a wrong password or an unknown user gets 28P01. Each runs on the
// server as itself (the server here trusts its logins).
func TestSCRAM(t *testing.T) {
	alice, bob := pgtest.NewRole(t, "alice", "LOGIN"), pgtest.NewRole(t, "bob", "LOGIN")
	secret, err := auth.NewSecret("bob's secret", 4096)
	if err != nil {
		t.Fatal(err)
	}
	users, err := auth.ParseUsers(strings.NewReader(`"` + alice + `" "wonderland"` + "\n" + `"` + bob + `" "` + secret.String() + `"`))
	if err != nil {
		t.Fatal(err)
	}
	e := startProxy(t, 1, nil, nil, func(c *proxy.Config) { c.Users = users })
	ctx := context.Background()
	connect := func(user, password string) error {
		c, err := pgconn.Connect(ctx, "postgres://"+user+":"+password+"@"+e.addr+"/"+testDatabase+"?sslmode=disable")
		if err == nil {
			defer c.Close(ctx)
			_, err = c.Exec(ctx, "SELECT 1").ReadAll()
		}
		return err
	}
	if err := connect(alice, "wonderland"); err != nil {
		t.Errorf("alice with a plain password in the file: %v", err)
	}
	if err := connect(bob, "bob%27s%20secret"); err != nil {
		t.Errorf("bob with a SCRAM secret in the file: %v", err)
	}
	if err := connect(alice, "nope"); sqlState(err) != "28P01" {
		t.Errorf("wrong password: %v, want 28P01", err)
	}
	if err := connect("mallory", "x"); sqlState(err) != "28P01" {
		t.Errorf("unknown user: %v, want 28P01", err)
	}
	out, err := run(t, time.Minute, "psql", "-X", "-A", "-t", "postgres://"+alice+":wonderland@"+e.addr+"/"+testDatabase+"?sslmode=disable", "-c", "SELECT current_user")
	if err != nil || strings.TrimSpace(out) != alice {
		t.Errorf("psql with SCRAM: %v\n%s", err, out)
	}
	if st := e.srv.Stats().Frontend; st.AuthFailed != 2 {
		t.Errorf("%d failed authentications counted, want 2", st.AuthFailed)
	}
}

// TestTLS: with a certificate the proxy speaks TLS to clients that ask; without one
// it answers SSLRequest with 'N' and clients that prefer SSL go on in the clear.
func TestTLS(t *testing.T) {
	cert := selfSigned(t)
	e := startProxy(t, 1, nil, nil, func(c *proxy.Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	})
	ctx := context.Background()
	c, err := pgconn.Connect(ctx, "postgres://postgres@"+e.addr+"/"+testDatabase+"?sslmode=require")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, ok := c.Conn().(*tls.Conn); !ok {
		t.Errorf("connection is %T, want TLS", c.Conn())
	}
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, time.Minute, "psql", "-X", "-A", "-t", "postgres://postgres@"+e.addr+"/"+testDatabase+"?sslmode=require", "-c", "SELECT 'tls'")
	if err != nil || strings.TrimSpace(out) != "tls" {
		t.Errorf("psql over TLS: %v\n%s", err, out)
	}

	plain := startProxy(t, 1, nil, nil)
	if _, err := pgconn.Connect(ctx, "postgres://postgres@"+plain.addr+"/"+testDatabase+"?sslmode=require"); err == nil {
		t.Error("sslmode=require connected to a proxy without TLS")
	}
	p, err := pgconn.Connect(ctx, "postgres://postgres@"+plain.addr+"/"+testDatabase+"?sslmode=prefer")
	if err != nil {
		t.Fatalf("sslmode=prefer without TLS: %v", err)
	}
	p.Close(ctx)
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientsRunAsThemselves: with a users file, each client runs on every shard as the
// server login the file gives it (itself, or the user it maps to), in a pool of its
// own per data source, and sees only what that user may see; a described statement
// of one user is never answered from another's. A login the server refuses ends the
// client's login.
func TestClientsRunAsThemselves(t *testing.T) {
	reader := pgtest.NewRole(t, "reader", "LOGIN")
	writer := pgtest.NewRole(t, "writer", "LOGIN")
	e := startProxy(t, 2, []string{"t=id"}, nil)
	admin := e.connect(t) // no users file yet: the data sources' own user
	exec1(t, admin, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec1(t, admin, "CREATE TABLE secret (x int)")
	exec1(t, admin, "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
	exec1(t, admin, "GRANT SELECT ON t TO "+reader)
	exec1(t, admin, "GRANT SELECT, INSERT, UPDATE ON t TO "+writer)
	// search_path's "$user" makes one text name different tables for different users
	// (made on each shard directly).
	for i := range e.dsns {
		s := e.shard(t, i)
		exec1(t, s, "CREATE TABLE mine (b text)")
		exec1(t, s, "GRANT SELECT ON mine TO "+reader)
		exec1(t, s, "CREATE SCHEMA "+reader+" AUTHORIZATION "+reader)
		exec1(t, s, "CREATE TABLE "+reader+".mine (a int)")
		exec1(t, s, "ALTER TABLE "+reader+".mine OWNER TO "+reader)
	}

	users, err := auth.ParseUsers(strings.NewReader(`"ann" "ann pw" "` + reader + `"` + "\n" +
		`"` + writer + `" "writer pw"` + "\n" + `"root" "root pw" "postgres"` + "\n" + `"ghost" "g" "no_such_role_xyz"`))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxyOn(t, shardedRules(e.dsns, []string{"t=id"}, nil), func(c *proxy.Config) { c.Users = users })
	ctx := context.Background()
	connect := func(user, password string) *pgconn.PgConn {
		t.Helper()
		c, err := pgconn.Connect(ctx, "postgres://"+user+":"+strings.ReplaceAll(password, " ", "%20")+"@"+p.addr+"/"+testDatabase+"?sslmode=disable")
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	one := func(c *pgconn.PgConn, sql string) (string, error) {
		res, err := c.Exec(ctx, sql).ReadAll()
		if err != nil {
			return "", err
		}
		if len(res) == 0 || len(res[0].Rows) == 0 {
			return "", nil
		}
		return string(res[0].Rows[0][0]), nil
	}
	ann, w, root := connect("ann", "ann pw"), connect(writer, "writer pw"), connect("root", "root pw")
	for _, tc := range []struct {
		c        *pgconn.PgConn
		who      string
		sql      string
		want     string // the answer, or
		wantCode string // the SQLSTATE
	}{
		{ann, "ann", "SELECT current_user", reader, ""},
		{ann, "ann", "SELECT count(*) FROM t", "3", ""}, // across both shards
		{ann, "ann", "INSERT INTO t VALUES (4, 'd')", "", "42501"},
		{ann, "ann", "UPDATE t SET v = 'x'", "", "42501"}, // on every shard
		{ann, "ann", "SELECT * FROM secret", "", "42501"},
		{w, writer, "SELECT session_user", writer, ""},
		{w, writer, "INSERT INTO t VALUES (4, 'd')", "", ""},
		{w, writer, "SELECT count(*) FROM t", "4", ""},
		{w, writer, "SELECT * FROM secret", "", "42501"},
		{root, "root", "SELECT current_user", "postgres", ""},
		{root, "root", "SELECT count(*) FROM secret", "0", ""},
	} {
		got, err := one(tc.c, tc.sql)
		if sqlState(err) != tc.wantCode || (tc.wantCode == "" && got != tc.want) {
			t.Errorf("%s: %s: %q, %v; want %q, SQLSTATE %q", tc.who, tc.sql, got, err, tc.want, tc.wantCode)
		}
	}
	// The same text described for root first, then for ann: each gets its own table's
	// columns, not an answer cached for the other.
	for _, c := range []struct {
		c    *pgconn.PgConn
		want string
	}{{root, "b"}, {ann, "a"}, {root, "b"}} {
		d, err := c.c.Prepare(ctx, "", "SELECT * FROM mine", nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Fields) != 1 || d.Fields[0].Name != c.want {
			t.Errorf("described columns %v, want %s", d.Fields, c.want)
		}
	}
	// A pool per data source and server user.
	logins := map[string]int{}
	for _, st := range p.srv.Stats().Pools {
		logins[st.User]++
	}
	if logins[reader] != 2 || logins[writer] != 2 || logins["postgres"] != 2 || len(logins) != 3 {
		t.Errorf("pools per server user: %v; want 2 each for %s, %s and postgres (root shares the data sources' own)", logins, reader, writer)
	}
	// A server login the server refuses ends the client's login.
	c, err := pgconn.Connect(ctx, "postgres://ghost:g@"+p.addr+"/"+testDatabase+"?sslmode=disable")
	if err == nil {
		c.Close(ctx)
	}
	if sqlState(err) != "28000" || !strings.Contains(err.Error(), "no_such_role_xyz") {
		t.Errorf("a login the server refuses: %v", err)
	}
}
