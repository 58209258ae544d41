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

	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/auth"
)

// TestSCRAM: with a users file, clients authenticate with SCRAM-SHA-256 (pgx and
// libpq's psql); a wrong password or an unknown user gets 28P01.
func TestSCRAM(t *testing.T) {
	secret, err := auth.NewSecret("bob's secret", 4096)
	if err != nil {
		t.Fatal(err)
	}
	users, err := auth.ParseUsers(strings.NewReader(`"alice" "wonderland"` + "\n" + `"bob" "` + secret.String() + `"`))
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
	if err := connect("alice", "wonderland"); err != nil {
		t.Errorf("alice with a plain password in the file: %v", err)
	}
	if err := connect("bob", "bob%27s%20secret"); err != nil {
		t.Errorf("bob with a SCRAM secret in the file: %v", err)
	}
	if err := connect("alice", "nope"); sqlState(err) != "28P01" {
		t.Errorf("wrong password: %v, want 28P01", err)
	}
	if err := connect("mallory", "x"); sqlState(err) != "28P01" {
		t.Errorf("unknown user: %v, want 28P01", err)
	}
	out, err := run(t, time.Minute, "psql", "-X", "-A", "-t", "postgres://alice:wonderland@"+e.addr+"/"+testDatabase+"?sslmode=disable", "-c", "SELECT 'in'")
	if err != nil || strings.TrimSpace(out) != "in" {
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
