package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/lab/server"
	"github.com/shardlab/shardlab/lab/shardset"
	"github.com/shardlab/shardlab/lab/shardset/sqlite"
	"github.com/shardlab/shardlab/routing"
)

// lab is a real server over a real 3-shard SQLite set, on loopback.
type lab struct {
	set *shardset.Set
	url string
}

func newLab(tb testing.TB) *lab { return newLabWith(tb, nil) }

// newLabWith is newLab with a counter store behind the counter endpoints (nil for none).
func newLabWith(tb testing.TB, counter counters.Counter) *lab {
	tb.Helper()
	ctx := context.Background()
	stores, err := sqlite.OpenShards(ctx, tb.TempDir(), 3, sqlite.Options{ReadConns: 2})
	if err != nil {
		tb.Fatal(err)
	}
	backends := make([]shardset.Backend, len(stores))
	for i, s := range stores {
		backends[i] = s
	}
	router, err := routing.NewCRC32(3)
	if err != nil {
		tb.Fatal(err)
	}
	set, err := shardset.New(router, backends)
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := server.New(server.Config{Set: set, Mode: "sharded", Backend: "sqlite", Sync: sqlite.SyncNormal, PoolSize: 2, Counter: counter})
	if err != nil {
		tb.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	tb.Cleanup(func() {
		ts.Close()
		if err := set.Close(); err != nil {
			tb.Errorf("close set: %v", err)
		}
	})
	return &lab{set: set, url: ts.URL}
}

// answer is a response read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (l *lab) do(tb testing.TB, method, path, contentType string, body []byte) answer {
	tb.Helper()
	req, err := http.NewRequest(method, l.url+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		tb.Fatalf("%s %s %q: %v", method, path, body, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: raw}
}

func (l *lab) insert(tb testing.TB, key, data string) answer {
	tb.Helper()
	body, err := json.Marshal(map[string]string{"user_id": key, "data": data})
	if err != nil {
		tb.Fatal(err)
	}
	return l.do(tb, http.MethodPost, "/insert", "application/json", body)
}

func (l *lab) get(tb testing.TB, key string) answer {
	tb.Helper()
	return l.do(tb, http.MethodGet, "/get?user_id="+url.QueryEscape(key), "", nil)
}

// checkJSONError asserts a is a JSON answer whose "error" is a non-empty string.
func checkJSONError(tb testing.TB, a answer) {
	tb.Helper()
	mt, _, err := mime.ParseMediaType(a.header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		tb.Errorf("Content-Type %q, want application/json", a.header.Get("Content-Type"))
	}
	var body map[string]any
	if err := json.Unmarshal(a.body, &body); err != nil {
		tb.Fatalf("body is not a JSON object: %v: %q", err, a.body)
	}
	msg, ok := body["error"].(string)
	if !ok || msg == "" {
		tb.Errorf(`body has no non-empty "error" string: %s`, a.body)
	}
	// A client hears about JSON, never about our Go code.
	for _, internal := range []string{"Go struct", "Go value", "insertRequest", "incrRequest", "json: ", "server."} {
		if strings.Contains(msg, internal) {
			tb.Errorf("error message %q speaks of Go internals (%q)", msg, internal)
		}
	}
}

func TestBadInput(t *testing.T) {
	l := newLab(t)
	long := strings.Repeat("u", server.MaxUserIDBytes+1)
	obj := func(userID, data string) []byte {
		b, _ := json.Marshal(map[string]string{"user_id": userID, "data": data})
		return b
	}
	const ctJSON = "application/json"
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        []byte
		want        int
		allow       string // wanted Allow header on a 405
	}{
		{name: "malformed JSON", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id": "a", "data":`), want: 400},
		{name: "not JSON at all", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`user_id=a&data=b`), want: 400},
		{name: "empty body", method: "POST", path: "/insert", contentType: ctJSON, body: nil, want: 400},
		{name: "whitespace body", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(" \n\t"), want: 400},
		{name: "second object after the first", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":"b"}{"user_id":"c","data":"d"}`), want: 400},
		{name: "garbage after the object", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":"b"} x`), want: 400},
		{name: "closing bracket after the object", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":"b"}]`), want: 400},
		{name: "body over MaxBodyBytes", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a", strings.Repeat("x", server.MaxBodyBytes)), want: 413},
		{name: "data over MaxDataBytes", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a", strings.Repeat("x", server.MaxDataBytes+1)), want: 413},
		{name: "missing user_id", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"data":"x"}`), want: 400},
		{name: "empty user_id", method: "POST", path: "/insert", contentType: ctJSON, body: obj("", "x"), want: 400},
		{name: "user_id over MaxUserIDBytes", method: "POST", path: "/insert", contentType: ctJSON, body: obj(long, "x"), want: 400},
		{name: "multi-byte user_id over MaxUserIDBytes", method: "POST", path: "/insert", contentType: ctJSON, body: obj(strings.Repeat("é", server.MaxUserIDBytes/2)+"x", "x"), want: 400},
		{name: "control character in user_id", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a\x01b", "x"), want: 400},
		{name: "newline in user_id", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a\nb", "x"), want: 400},
		{name: "NUL in user_id", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a\x00", "x"), want: 400},
		{name: "DEL in user_id", method: "POST", path: "/insert", contentType: ctJSON, body: obj("a\x7f", "x"), want: 400},
		{name: "invalid UTF-8 in user_id", method: "POST", path: "/insert", contentType: ctJSON, body: []byte("{\"user_id\":\"a\xff\",\"data\":\"x\"}"), want: 400},
		{name: "invalid UTF-8 in data", method: "POST", path: "/insert", contentType: ctJSON, body: []byte("{\"user_id\":\"a\",\"data\":\"\xc3\x28\"}"), want: 400},
		{name: "GET on /insert", method: "GET", path: "/insert", want: 405, allow: "POST"},
		{name: "PUT on /insert", method: "PUT", path: "/insert", contentType: ctJSON, body: obj("a", "b"), want: 405, allow: "POST"},
		{name: "DELETE on /get", method: "DELETE", path: "/get?user_id=a", want: 405, allow: "GET"},
		{name: "POST on /get", method: "POST", path: "/get?user_id=a", contentType: ctJSON, body: obj("a", "b"), want: 405, allow: "GET"},
		{name: "POST on /healthz", method: "POST", path: "/healthz", want: 405, allow: "GET"},
		{name: "missing Content-Type", method: "POST", path: "/insert", body: obj("a", "b"), want: 415},
		{name: "text/plain", method: "POST", path: "/insert", contentType: "text/plain", body: obj("a", "b"), want: 415},
		{name: "form encoding", method: "POST", path: "/insert", contentType: "application/x-www-form-urlencoded", body: []byte("user_id=a&data=b"), want: 415},
		{name: "unparsable Content-Type", method: "POST", path: "/insert", contentType: "application/json; =", body: obj("a", "b"), want: 415},
		{name: "unknown field", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":"b","ttl":5}`), want: 400},
		{name: "data missing", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a"}`), want: 400},
		{name: "data null", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":null}`), want: 400},
		{name: "JSON array", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`[{"user_id":"a","data":"b"}]`), want: 400},
		{name: "JSON null", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`null`), want: 400},
		{name: "JSON string", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`"a"`), want: 400},
		{name: "null user_id", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":null,"data":"b"}`), want: 400},
		{name: "number user_id", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":42,"data":"b"}`), want: 400},
		{name: "number data", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":42}`), want: 400},
		{name: "object data", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":"a","data":{"x":1}}`), want: 400},
		{name: "bool user_id", method: "POST", path: "/insert", contentType: ctJSON, body: []byte(`{"user_id":true,"data":"b"}`), want: 400},
		{name: "get without user_id", method: "GET", path: "/get", want: 400},
		{name: "get with user_id twice", method: "GET", path: "/get?user_id=a&user_id=b", want: 400},
		{name: "get with unknown parameter", method: "GET", path: "/get?user_id=a&shard=1", want: 400},
		{name: "get with empty user_id", method: "GET", path: "/get?user_id=", want: 400},
		{name: "get with user_id over MaxUserIDBytes", method: "GET", path: "/get?user_id=" + long, want: 400},
		{name: "get with control character", method: "GET", path: "/get?user_id=a%01", want: 400},
		{name: "get with invalid UTF-8", method: "GET", path: "/get?user_id=a%FF", want: 400},
		{name: "unknown path", method: "GET", path: "/nope", want: 404},
		{name: "unknown path below insert", method: "POST", path: "/insert/x", contentType: ctJSON, body: obj("a", "b"), want: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := l.do(t, tt.method, tt.path, tt.contentType, tt.body)
			if a.status != tt.want {
				t.Errorf("status %d, want %d; body %s", a.status, tt.want, a.body)
			}
			checkJSONError(t, a)
			if tt.allow != "" && a.header.Get("Allow") != tt.allow {
				t.Errorf("Allow %q, want %q", a.header.Get("Allow"), tt.allow)
			}
		})
	}
	// None of the refused writes may have stored anything.
	counts, err := l.set.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range counts {
		if n != 0 {
			t.Errorf("shard %d holds %d records after refused writes only", i, n)
		}
	}
}

// TestLimitsAreInclusive: a user_id of exactly MaxUserIDBytes and data of exactly
// MaxDataBytes are accepted, and a Content-Type with parameters is fine.
func TestLimitsAreInclusive(t *testing.T) {
	l := newLab(t)
	key := strings.Repeat("k", server.MaxUserIDBytes)
	data := strings.Repeat("d", server.MaxDataBytes)
	if a := l.insert(t, key, data); a.status != http.StatusOK {
		t.Fatalf("insert at the limits: %d %s", a.status, a.body)
	}
	body, _ := json.Marshal(map[string]string{"user_id": "charset", "data": "x"})
	if a := l.do(t, "POST", "/insert", "application/json; charset=utf-8", body); a.status != http.StatusOK {
		t.Errorf("Content-Type with charset: %d %s", a.status, a.body)
	}
	a := l.get(t, key)
	var rec struct{ Data string }
	if err := json.Unmarshal(a.body, &rec); err != nil || a.status != http.StatusOK {
		t.Fatalf("get: %d %v %s", a.status, err, a.body)
	}
	if rec.Data != data {
		t.Errorf("data at the limit came back with %d bytes, want %d", len(rec.Data), len(data))
	}
}

type record struct {
	UserID string `json:"user_id"`
	Data   string `json:"data"`
	Shard  *int   `json:"shard"`
}

func TestRoundTripByteForByte(t *testing.T) {
	l := newLab(t)
	tests := []struct{ name, key, data string }{
		{"plain", "user1", "hello"},
		{"empty data", "empty", ""},
		{"unicode", "名前-ключ-🔑", "héllo wörld 日本語 🎉 \u00a0\u2028\u2029"},
		{"quotes and backslashes", `q"u\o'te`, `say "hi" \ back\slash \\ \" \n literally`},
		{"newlines and tabs in data", "nl", "line1\nline2\r\n\ttab\x00nul\x1f\x7f"},
		{"HTML characters", "<b>&amp;</b>", "<script>alert('x & y')</script>"},
		{"URL characters in key", "a&b=c?d#e%20f+g /h", "url"},
		{"JSON-looking data", "json", `{"user_id":"other","data":"x"}`},
		{"replacement character sent as such", "fffd", "\ufffd"},
		{"key exactly at the limit in multi-byte runes", strings.Repeat("é", server.MaxUserIDBytes/2), "x"},
		{"data exactly at the limit", "big", strings.Repeat("0123456789abcdef", server.MaxDataBytes/16)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := l.insert(t, tt.key, tt.data)
			if a.status != http.StatusOK {
				t.Fatalf("insert: %d %s", a.status, a.body)
			}
			var ack struct {
				UserID string `json:"user_id"`
				Shard  *int   `json:"shard"`
				Status string `json:"status"`
			}
			if err := json.Unmarshal(a.body, &ack); err != nil {
				t.Fatal(err)
			}
			want := l.set.ShardFor(tt.key)
			if ack.UserID != tt.key || ack.Shard == nil || *ack.Shard != want || ack.Status != "stored" {
				t.Errorf("insert answered %s; want user_id %q on shard %d", a.body, tt.key, want)
			}
			g := l.get(t, tt.key)
			if g.status != http.StatusOK {
				t.Fatalf("get: %d %s", g.status, g.body)
			}
			var rec record
			if err := json.Unmarshal(g.body, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Data != tt.data {
				t.Errorf("data came back as %q, want %q", rec.Data, tt.data)
			}
			if rec.UserID != tt.key || rec.Shard == nil || *rec.Shard != want {
				t.Errorf("get answered %s; want user_id %q on shard %d", g.body, tt.key, want)
			}
			// The shard the set reads from holds the exact bytes.
			raw, shard, err := l.set.Get(context.Background(), tt.key)
			if err != nil || shard != want || !bytes.Equal(raw, []byte(tt.data)) {
				t.Errorf("set.Get = %q, %d, %v", raw, shard, err)
			}
		})
	}
}

func TestUpsertReplacesAndMissIsJSON404(t *testing.T) {
	l := newLab(t)
	for _, v := range []string{"first", "second", ""} {
		if a := l.insert(t, "u", v); a.status != http.StatusOK {
			t.Fatalf("insert %q: %d %s", v, a.status, a.body)
		}
		var rec record
		g := l.get(t, "u")
		if err := json.Unmarshal(g.body, &rec); err != nil || rec.Data != v {
			t.Fatalf("after writing %q, get answered %d %s", v, g.status, g.body)
		}
	}
	counts, err := l.set.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if total := counts[0] + counts[1] + counts[2]; total != 1 {
		t.Errorf("3 writes of one key left %d records", total)
	}

	a := l.get(t, "nobody")
	if a.status != http.StatusNotFound {
		t.Fatalf("unknown key: %d %s", a.status, a.body)
	}
	checkJSONError(t, a)
	var miss struct {
		UserID string `json:"user_id"`
		Shard  *int   `json:"shard"`
	}
	if err := json.Unmarshal(a.body, &miss); err != nil || miss.UserID != "nobody" || miss.Shard == nil || *miss.Shard != l.set.ShardFor("nobody") {
		t.Errorf("404 body %s; want user_id and the owning shard", a.body)
	}
}

func TestHealthzStatsMetrics(t *testing.T) {
	l := newLab(t)
	const n = 30
	perShard := make([]int64, 3)
	for i := range n {
		key := fmt.Sprintf("user%d", i)
		if a := l.insert(t, key, "v"); a.status != http.StatusOK {
			t.Fatalf("insert: %d %s", a.status, a.body)
		}
		perShard[l.set.ShardFor(key)]++
	}
	for i := range 5 {
		if a := l.get(t, fmt.Sprintf("user%d", i)); a.status != http.StatusOK {
			t.Fatalf("get: %d", a.status)
		}
	}
	l.get(t, "missing1")
	l.get(t, "missing2")
	l.do(t, "GET", "/get", "", nil)                                   // client error
	l.do(t, "POST", "/insert", "application/json", []byte(`{"x":1}`)) // client error

	a := l.do(t, "GET", "/healthz", "", nil)
	var health struct {
		Status string `json:"status"`
		Shards []struct {
			Shard int  `json:"shard"`
			OK    bool `json:"ok"`
		} `json:"shards"`
	}
	if err := json.Unmarshal(a.body, &health); err != nil || a.status != http.StatusOK || health.Status != "ok" || len(health.Shards) != 3 {
		t.Errorf("/healthz: %d %s", a.status, a.body)
	}
	for i, s := range health.Shards {
		if s.Shard != i || !s.OK {
			t.Errorf("/healthz shard entry %d: %+v", i, s)
		}
	}

	a = l.do(t, "GET", "/stats", "", nil)
	if a.status != http.StatusOK {
		t.Fatalf("/stats: %d %s", a.status, a.body)
	}
	var st server.Stats
	if err := json.Unmarshal(a.body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode != "sharded" || st.Backend != "sqlite" || st.Router != "crc32" || st.Shards != 3 || st.Sync != "normal" || st.PoolSize != 2 {
		t.Errorf("/stats settings: %s", a.body)
	}
	var sum int64
	for i, c := range st.RowsPerShard {
		sum += c
		if c != perShard[i] {
			t.Errorf("rows_per_shard[%d] = %d, want %d", i, c, perShard[i])
		}
	}
	if len(st.RowsPerShard) != 3 || sum != n {
		t.Errorf("rows_per_shard %v sums to %d, want %d over 3 shards", st.RowsPerShard, sum, n)
	}
	// client_errors counts the two refused requests; the two misses (404) are counted
	// as get_misses only.
	wantReq := map[string]int64{"insert": n + 1, "get": 8, "get_hits": 5, "get_misses": 2, "client_errors": 2, "shard_errors": 0}
	for k, v := range wantReq {
		if st.Requests[k] != v {
			t.Errorf("requests[%q] = %d, want %d (all: %v)", k, st.Requests[k], v, st.Requests)
		}
	}

	a = l.do(t, "GET", "/metrics", "", nil)
	if a.status != http.StatusOK {
		t.Fatalf("/metrics: %d", a.status)
	}
	for _, want := range []string{
		`shardlab_requests_total{code="200",endpoint="insert"} 30`,
		`shardlab_requests_total{code="404",endpoint="get"} 2`,
		`shardlab_requests_total{code="400",endpoint="get"} 1`,
		fmt.Sprintf(`shardlab_shard_rows{shard="0"} %d`, perShard[0]),
		fmt.Sprintf(`shardlab_shard_rows{shard="2"} %d`, perShard[2]),
		"shardlab_request_duration_seconds_bucket",
	} {
		if !strings.Contains(string(a.body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// FuzzInsert posts arbitrary bodies: the server must never answer 5xx, every refusal is a
// JSON error, and whatever it acknowledges reads back byte for byte.
func FuzzInsert(f *testing.F) {
	for _, seed := range []string{
		`{"user_id":"a","data":"b"}`,
		`{"user_id":"\u00e9\"\\","data":"\n\t\u0000"}`,
		`{"user_id":"a","data":"b"}{}`,
		`[1,2]`,
		`{"user_id":"","data":""}`,
	} {
		f.Add([]byte(seed))
	}
	l := newLab(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		a := l.do(t, http.MethodPost, "/insert", "application/json", body)
		if a.status >= 500 {
			t.Fatalf("status %d for body %q: %s", a.status, body, a.body)
		}
		if a.status != http.StatusOK {
			if a.status < 400 {
				t.Fatalf("status %d for body %q", a.status, body)
			}
			checkJSONError(t, a)
			return
		}
		var sent struct {
			UserID string `json:"user_id"`
			Data   string `json:"data"`
		}
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Fatalf("server accepted %q, which encoding/json refuses: %v", body, err)
		}
		g := l.get(t, sent.UserID)
		if g.status != http.StatusOK {
			t.Fatalf("acknowledged %q but get answered %d %s", body, g.status, g.body)
		}
		var rec record
		if err := json.Unmarshal(g.body, &rec); err != nil {
			t.Fatal(err)
		}
		// Another input may have written the same key since only if it ran in between,
		// and inputs run one at a time per process.
		if rec.Data != sent.Data || rec.UserID != sent.UserID {
			t.Fatalf("stored %q under %q, read back %q under %q", sent.Data, sent.UserID, rec.Data, rec.UserID)
		}
	})
}
