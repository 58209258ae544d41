package admin

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestParseCutover reads RESHARD CUTOVER's arguments, and refuses what is not them.
func TestParseCutover(t *testing.T) {
	for _, c := range []struct {
		arg    string
		ok     bool
		rules  string
		verify time.Duration
	}{
		{arg: "'/tmp/to.toml'", ok: true, rules: "/tmp/to.toml"},
		{arg: "'/tmp/it''s here.toml'", ok: true, rules: "/tmp/it's here.toml"},
		{arg: "'/tmp/to.toml' VERIFY 30", ok: true, rules: "/tmp/to.toml", verify: 30 * time.Second},
		{arg: "'/tmp/to.toml'  verify  0.5", ok: true, rules: "/tmp/to.toml", verify: 500 * time.Millisecond},
		{arg: "'/tmp/a b.toml' VERIFY 2", ok: true, rules: "/tmp/a b.toml", verify: 2 * time.Second},
		{arg: "/tmp/to.toml"},
		{arg: "''"},
		{arg: "'/tmp/to.toml"},
		{arg: "'/tmp/to.toml' VERIFY"},
		{arg: "'/tmp/to.toml' VERIFY 0"},
		{arg: "'/tmp/to.toml' VERIFY -3"},
		{arg: "'/tmp/to.toml' VERIFY NaN"},
		{arg: "'/tmp/to.toml' VERIFY 30 now"},
		{arg: "'/tmp/to.toml' 30"},
	} {
		got, ok := parseCutover(c.arg)
		if ok != c.ok || (ok && (got.Rules != c.rules || got.Verify != c.verify || got.Verb != "CUTOVER")) {
			t.Errorf("%s: %+v %v, want ok %v, rules %q, verify %v", c.arg, got, ok, c.ok, c.rules, c.verify)
		}
	}
}

// FuzzParseCutover: any rules file path, quoted as reshard cutover --proxy-admin
// quotes it (a quote doubled), reads back as itself, with or without VERIFY.
func FuzzParseCutover(f *testing.F) {
	f.Add("/tmp/to.toml", 30.0)
	f.Add("/tmp/it's VERIFY 3.toml", 0.5)
	f.Add("''", 0.0)
	f.Fuzz(func(t *testing.T, path string, secs float64) {
		if path == "" {
			return
		}
		arg := "'" + strings.ReplaceAll(path, "'", "''") + "'"
		c, ok := parseCutover(arg)
		if !ok || c.Rules != path || c.Verify != 0 {
			t.Fatalf("%q: %+v %v", arg, c, ok)
		}
		arg += fmt.Sprintf(" VERIFY %g", secs)
		c, ok = parseCutover(arg)
		want := secs >= 0.001 && secs <= 3600
		if ok != want || (ok && c.Rules != path) {
			t.Fatalf("%q: %+v %v, want ok %v", arg, c, ok, want)
		}
	})
}
