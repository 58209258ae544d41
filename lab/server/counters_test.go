package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/counters"
)

func newCounterLab(t *testing.T) *lab {
	t.Helper()
	c, err := counters.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "counters.db"),
		counters.Options{Strategy: counters.StrategyBucket, Buckets: 8, BucketBy: counters.BucketWorker}, counters.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return newLabWith(t, c)
}

func TestCounterEndpoints(t *testing.T) {
	l := newCounterLab(t)
	for _, body := range []string{`{"key":"1.2.3.4","by":2}`, `{"key":"1.2.3.4"}`, `{"key":"1.2.3.4","by":5}`} {
		if a := l.do(t, http.MethodPost, "/counter/incr", "application/json", []byte(body)); a.status != http.StatusOK {
			t.Fatalf("%s: %d %s", body, a.status, a.body)
		}
	}
	a := l.do(t, http.MethodGet, "/counter?key=1.2.3.4", "", nil)
	var v struct {
		Key      string    `json:"key"`
		Count    int64     `json:"count"`
		LastSeen time.Time `json:"last_seen"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil || a.status != http.StatusOK {
		t.Fatalf("GET /counter: %d %s %v", a.status, a.body, err)
	}
	if v.Key != "1.2.3.4" || v.Count != 8 || time.Since(v.LastSeen) > time.Minute {
		t.Errorf("GET /counter = %+v, want count 8 (2 + default 1 + 5) and a recent last_seen", v)
	}
	miss := l.do(t, http.MethodGet, "/counter?key=never", "", nil)
	if miss.status != http.StatusNotFound {
		t.Errorf("unknown key: %d %s", miss.status, miss.body)
	}
	checkJSONError(t, miss)
}

func TestCounterBadInput(t *testing.T) {
	l := newCounterLab(t)
	cases := []struct {
		name, method, path, ct, body string
		want                         int
	}{
		{"malformed", "POST", "/counter/incr", "application/json", `{"key":`, 400},
		{"no key", "POST", "/counter/incr", "application/json", `{"by":1}`, 400},
		{"empty key", "POST", "/counter/incr", "application/json", `{"key":"","by":1}`, 400},
		{"long key", "POST", "/counter/incr", "application/json", `{"key":"` + strings.Repeat("k", counters.MaxKeyLen+1) + `","by":1}`, 400},
		{"by zero", "POST", "/counter/incr", "application/json", `{"key":"k","by":0}`, 400},
		{"by negative", "POST", "/counter/incr", "application/json", `{"key":"k","by":-3}`, 400},
		{"by too large", "POST", "/counter/incr", "application/json", `{"key":"k","by":1000000000000}`, 400},
		{"by fractional", "POST", "/counter/incr", "application/json", `{"key":"k","by":1.5}`, 400},
		{"by string", "POST", "/counter/incr", "application/json", `{"key":"k","by":"1"}`, 400},
		{"unknown field", "POST", "/counter/incr", "application/json", `{"key":"k","by":1,"x":1}`, 400},
		{"wrong content type", "POST", "/counter/incr", "text/plain", `{"key":"k"}`, 415},
		{"wrong method incr", "GET", "/counter/incr", "", "", 405},
		{"wrong method read", "POST", "/counter", "application/json", `{}`, 405},
		{"read without key", "GET", "/counter", "", "", 400},
		{"read key twice", "GET", "/counter?key=a&key=b", "", "", 400},
		{"read extra parameter", "GET", "/counter?key=a&x=1", "", "", 400},
		{"read empty key", "GET", "/counter?key=", "", "", 400},
	}
	for _, c := range cases {
		a := l.do(t, c.method, c.path, c.ct, []byte(c.body))
		if a.status != c.want {
			t.Errorf("%s: status %d, want %d: %s", c.name, a.status, c.want, a.body)
		}
		checkJSONError(t, a)
	}
	// Nothing was counted by the refused requests.
	if a := l.do(t, http.MethodGet, "/counter?key=k", "", nil); a.status != http.StatusNotFound {
		t.Errorf("refused increments were counted: %d %s", a.status, a.body)
	}
}

func TestCounterEndpointsAbsentWithoutStore(t *testing.T) {
	l := newLab(t)
	a := l.do(t, http.MethodPost, "/counter/incr", "application/json", []byte(`{"key":"k"}`))
	if a.status != http.StatusNotFound {
		t.Errorf("counter endpoint without a store: %d %s", a.status, a.body)
	}
	checkJSONError(t, a)
}
