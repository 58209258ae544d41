package reshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/rules"
)

func writeRules(t *testing.T, dsns ...string) string {
	t.Helper()
	var b strings.Builder
	for i, d := range dsns {
		fmt.Fprintf(&b, "[[data_source]]\nname = \"ds_%d\"\ndsn = %q\n\n", i, d)
	}
	b.WriteString("[[sharded_table]]\nname = \"items\"\ncolumn = \"id\"\n")
	path := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUsage: help, and each bad invocation an exit-2 error saying what is wrong.
func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := Main(context.Background(), []string{"--help"}, &out, &errOut); err != nil || !strings.Contains(out.String(), "plan [--json]") || !strings.Contains(out.String(), "cancel") {
		t.Errorf("--help: %v\n%s", err, out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("[[data_source]]\nnam = \"x\"\n"), 0o644)
	good := writeRules(t, "postgres://postgres@127.0.0.1:1/x")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "reshard plan|start|status|verify|cancel|cutover|finish|revert --from"},
		{[]string{"move"}, `unknown command "move"`},
		{[]string{"plan"}, "plan needs --from and --to"},
		{[]string{"cancel", "--to", good}, "cancel needs --from and --to"},
		{[]string{"plan", "--from", good}, "plan needs --from and --to"},
		{[]string{"plan", "--from", good, "--to", good, "extra"}, `plan takes no arguments, got "extra"`},
		{[]string{"plan", "--from", bad, "--to", good}, "--from: "},
		{[]string{"plan", "--from", good, "--to", filepath.Join(t.TempDir(), "missing.toml")}, "--to: "},
		{[]string{"plan", "--frm", good}, "flag provided but not defined: -frm"},
		{[]string{"plan", "--from", good, "--to", good, "--proxy-admin", "postgres://x"}, "--proxy-admin is for cutover, finish, revert, not plan"},
		{[]string{"start", "--from", good, "--to", good, "--resume"}, "--resume is for verify, not start"},
		{[]string{"status", "--from", good, "--to", good, "--max-active", "3"}, "--max-active is for start, verify, not status"},
		{[]string{"cutover", "--from", good, "--to", good, "--catch-up", "1s", "--pin", "1s"}, "--pin is for verify, not cutover"},
		{[]string{"cutover", "--from", good, "--to", good, "--proxy-admin", "postgres://x", "--catch-up", "1s"}, "--catch-up is for cutover without --proxy-admin"},
		{[]string{"finish", "--from", good, "--to", good, "--delete-rate", "-1"}, "--delete-rate takes a number of rows a second"},
		{[]string{"start", "--from", good, "--to", good, "--copy-rate", "-5"}, "--copy-rate takes a number of rows a second"},
		{[]string{"start", "--from", good, "--to", good, "--max-active", "-1"}, "--max-active takes a number of sessions"},
		{[]string{"verify", "--from", good, "--to", good, "--pin", "-1s"}, "--pin takes a bound from 1ms"},
		{[]string{"verify", "--from", good, "--to", good, "--pin", "10us"}, "--pin takes a bound from 1ms"},
		{[]string{"verify", "--from", good, "--to", good, "--pin-every", "1s"}, "--pin-every takes a duration, and --pin with it"},
		{[]string{"cutover", "--from", good}, "cutover needs --from and --to"},
	} {
		err := Main(context.Background(), tc.args, &out, &errOut)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestPlanCommand plans 1 data source to 2 on the test server: the plan is printed
// (as text and as JSON), and a server with wal_level = replica blocks it (exit 1).
func TestPlanCommand(t *testing.T) {
	a, b := pgtest.NewDatabase(t, "reshardcli"), pgtest.NewDatabase(t, "reshardcli")
	ctx := context.Background()
	c, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var walLevel string
	if err := c.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&walLevel); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	from, to := writeRules(t, a), writeRules(t, a, b)
	var out, errOut bytes.Buffer
	err = Main(ctx, []string{"plan", "--from", from, "--to", to}, &out, &errOut)
	if walLevel == "logical" {
		if err != nil {
			t.Errorf("plan: %v\n%s", err, out.String())
		}
	} else if !errors.Is(err, errBlocked) || !strings.Contains(out.String(), "wal_level = "+walLevel) {
		t.Errorf("plan on a server with wal_level = %s: %v, want it blocked, naming the setting\n%s", walLevel, err, out.String())
	}
	if !strings.Contains(out.String(), "table items (key id int4; target algorithm pghash)") || !strings.Contains(out.String(), "of 100 rows move") {
		t.Errorf("plan:\n%s", out.String())
	}
	out.Reset()
	Main(ctx, []string{"plan", "--from", from, "--to", to, "--json"}, &out, &errOut)
	if !strings.Contains(out.String(), `"Name": "items"`) || !strings.Contains(out.String(), `"Streams": [`) {
		t.Errorf("--json:\n%s", out.String())
	}
}

// TestExampleLayouts: the layouts docs/reshard.md plans between are valid rules.
func TestExampleLayouts(t *testing.T) {
	for _, f := range []string{"layout2.toml", "layout3.toml", "layout4.toml"} {
		c, err := rules.Load(filepath.Join("..", "..", "..", "examples", "reshard", f))
		if err != nil {
			t.Fatal(err)
		}
		if c.Lookup("people").Kind != rules.KindSharded || c.Lookup("countries").Kind != rules.KindBroadcast {
			t.Errorf("%s: people and countries are not sharded and broadcast", f)
		}
	}
}

// TestStartStatusCancel drives a move of 1 data source to 2 through the command: start
// says it started, status shows the stream, a second start fails, cancel removes it and
// status then finds none.
func TestStartStatusCancel(t *testing.T) {
	c := pgtest.StartClusterWith(t, "wal_level = logical", "max_logical_replication_workers = 8", "max_worker_processes = 12")
	a, b := c.NewDatabase("reshardcli"), c.NewDatabase("reshardcli")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	from, to := writeRules(t, a), writeRules(t, a, b)
	step := func(want error, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		err := Main(ctx, append(args, "--from", from, "--to", to), &out, &errOut)
		if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%v: %v, want %v\n%s%s", args, err, want, out.String(), errOut.String())
		}
		return out.String()
	}
	if out := step(nil, "start"); !strings.Contains(out, "the move has started") {
		t.Errorf("start: %s", out)
	}
	if out := step(nil, "status"); !strings.Contains(out, "ds_0 -> ds_1") || !strings.Contains(out, "items") {
		t.Errorf("status: %s", out)
	}
	// Watching returns once the stream is ready, having printed a rate.
	{
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		var out, errOut bytes.Buffer
		err := Main(wctx, []string{"status", "--watch", "100ms", "--from", from, "--to", to}, &out, &errOut)
		cancel()
		if err != nil || !strings.Contains(out.String(), "the move is ready for the cutover") {
			t.Errorf("status --watch: %v\n%s", err, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if err := Main(ctx, []string{"start", "--from", from, "--to", to}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Errorf("a second start: %v", err)
	}
	// Once copied, verify finds every row; a row lost on the destination fails it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out.Reset()
		err := Main(ctx, []string{"verify", "--settle", "200ms", "--from", from, "--to", to}, &out, &errOut)
		if err == nil && strings.Contains(out.String(), "every stream's rows are on its destination") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("verify: %v\n%s", err, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	out.Reset()
	if err := Main(ctx, []string{"verify", "--pin", "5s", "--from", from, "--to", to}, &out, &errOut); err != nil ||
		!strings.Contains(out.String(), "every stream's rows are on its destination") || !strings.Contains(out.String(), "pinned: each table compared at one point") {
		t.Errorf("verify --pin: %v\n%s", err, out.String())
	}
	// A verify interrupted (its context cancelled, as by Ctrl-C) once it has recorded a
	// chunk says how to go on, and --resume goes on from there.
	{
		vctx, cancel := context.WithCancel(ctx)
		var polled sync.WaitGroup
		polled.Go(func() {
			defer cancel()
			for vctx.Err() == nil {
				var chunks int
				conn.QueryRow(vctx, `SELECT coalesce(max((diff->>'Chunks')::int), 0) FROM shardlab_reshard.verified
					WHERE EXISTS (SELECT FROM shardlab_reshard.verify_run WHERE finished IS NULL)`).Scan(&chunks)
				if chunks >= 1 {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
		out.Reset()
		err := Main(vctx, []string{"verify", "--chunk-rows", "10", "--rate", "10", "--from", from, "--to", to}, &out, &errOut)
		cancel()
		polled.Wait()
		if err == nil || !strings.Contains(err.Error(), "verify --resume continues it") {
			t.Errorf("verify interrupted: %v, want how to resume it\n%s", err, out.String())
		}
		out.Reset()
		if err := Main(ctx, []string{"verify", "--resume", "--chunk-rows", "10", "--from", from, "--to", to}, &out, &errOut); err != nil ||
			!strings.Contains(out.String(), "every stream's rows are on its destination") || !regexp.MustCompile(`resumed the verify started .*: [1-9][0-9]* of the chunks`).MatchString(out.String()) {
			t.Errorf("verify --resume: %v\n%s", err, out.String())
		}
	}
	bconn, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer bconn.Close(ctx)
	if _, err := bconn.Exec(ctx, "DELETE FROM items WHERE id = (SELECT min(id) FROM items)"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Main(ctx, []string{"verify", "--settle", "200ms", "--from", from, "--to", to}, &out, &errOut); err == nil || !strings.Contains(out.String(), "1 missing") {
		t.Errorf("verify with a row lost: %v\n%s", err, out.String())
	}
	step(nil, "cancel")
	if out := step(nil, "status"); !strings.Contains(out, "no move is under way") {
		t.Errorf("status after cancel: %s", out)
	}
}
