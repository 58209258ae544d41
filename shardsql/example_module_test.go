package shardsql_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestExampleModule builds and runs examples/orders, a module of its own that requires
// shardlab (through a replace directive to this checkout) and uses the driver through
// plain database/sql: proof that another module can import it.
func TestExampleModule(t *testing.T) {
	dsns := []string{pgtest.NewDatabase(t, "example0"), pgtest.NewDatabase(t, "example1")}
	example, err := filepath.Abs("../examples/orders")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(example, "rules.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	rulesText := string(tmpl)
	for i, d := range dsns {
		rulesText = strings.Replace(rulesText, fmt.Sprintf("postgres://postgres@127.0.0.1:5432/orders_%d?sslmode=disable", i), d, 1)
	}
	if strings.Contains(rulesText, "orders_0") || strings.Contains(rulesText, "orders_1") {
		t.Fatal("the example's rules file no longer has the DSNs this test replaces")
	}
	rulesFile := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(rulesFile, []byte(rulesText), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "orders")
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the example: %v", err)
	}
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = example
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in examples/orders: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, bin, "-rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s", err, out)
	}
	want := "order 4: customer-1 bought sku-4\ncustomer-0: 2 orders, 94.50 in all\ncustomer-1: 2 orders, 52.50 in all\ndone\n"
	if string(out) != want {
		t.Errorf("the example printed\n%s\nwant\n%s", out, want)
	}
}
