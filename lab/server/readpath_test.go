package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"unicode/utf8"
)

// encoderRecord is what the /get answer was written from before writeRecord: the
// record struct through encoding/json's Encoder, HTML escaping on.
func encoderRecord(tb testing.TB, id string, data []byte, shard int) []byte {
	tb.Helper()
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(struct {
		UserID string `json:"user_id"`
		Data   string `json:"data"`
		Shard  int    `json:"shard"`
	}{id, string(data), shard})
	if err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzGetAnswerMatchesEncodingJSON stores arbitrary bytes (below the HTTP API, so
// invalid UTF-8 too) under an arbitrary valid key and checks that /get answers with
// exactly the bytes encoding/json writes for that record.
func FuzzGetAnswerMatchesEncodingJSON(f *testing.F) {
	for _, s := range []struct{ id, data string }{
		{"user1", "hello"}, {"k", ""}, {"<&>", "<script>&amp;</script>"},
		{"q\"b\\s", "\"\\/\b\f\n\r\t\x00\x01\x1f\x7f"}, {"ключ-🔑", "\u2028\u2029\u2027 é 🔑"},
		{"bad", "\xff\xfe\xc3\x28 \xe2\x82 \xf0\x9f\x98"}, {"x", "\xed\xa0\x80"},
	} {
		f.Add(s.id, []byte(s.data))
	}
	l := newLab(f)
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		if id == "" || len(id) > 128 || !utf8.ValidString(id) || bytes.ContainsFunc([]byte(id), func(r rune) bool { return r < 0x20 || r == 0x7f }) || len(data) > 64<<10 {
			t.Skip("not a key and value the API accepts")
		}
		shard, err := l.set.Put(context.Background(), id, data)
		if err != nil {
			t.Fatal(err)
		}
		a := l.get(t, id)
		if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET %q: %d %q", id, a.status, a.header.Get("Content-Type"))
		}
		if want := encoderRecord(t, id, data, shard); !bytes.Equal(a.body, want) {
			t.Errorf("GET %q answered\n%q\nwant (encoding/json)\n%q", id, a.body, want)
		}
	})
}

// TestGetQueryStrings: the query strings that /get reads without url.Values and those
// it leaves to the general path get the same answers as ever.
func TestGetQueryStrings(t *testing.T) {
	l := newLab(t)
	for _, kv := range [][2]string{{"a b", "space"}, {"a+b", "plus"}, {"a", "plain"}, {"a;b", "semicolon"}, {"a&b", "ampersand"}} {
		if a := l.insert(t, kv[0], kv[1]); a.status != http.StatusOK {
			t.Fatalf("insert %q: %d", kv[0], a.status)
		}
	}
	tests := []struct {
		query  string
		status int
		data   string // for 200
	}{
		{"user_id=a", 200, "plain"},
		{"user_id=a+b", 200, "space"},
		{"user_id=a%20b", 200, "space"},
		{"user_id=a%2Bb", 200, "plus"},
		{"user_id=a%3Bb", 200, "semicolon"},
		{"user_id=a%26b", 200, "ampersand"},
		{"user%5Fid=a", 200, "plain"}, // an escaped name is still user_id
		{"user_id=nobody", 404, ""},
		{"user_id=", 400, ""},
		{"user_id=%zz", 400, ""},         // a bad escape: no user_id at all
		{"user_id=a;b", 400, ""},         // a ';' spoils the pair
		{"user_id=a&user_id=a", 400, ""}, // twice
		{"user_id=a&x=1", 400, ""},       // unknown parameter
		{"x=1&user_id=a", 400, ""},
		{"user_id=a&", 200, "plain"}, // an empty pair is nothing
		{"", 400, ""},
		{"user_id=%01", 400, ""}, // a control character
	}
	for _, tt := range tests {
		a := l.do(t, http.MethodGet, "/get?"+tt.query, "", nil)
		if a.status != tt.status {
			t.Errorf("GET /get?%s: %d %s, want %d", tt.query, a.status, a.body, tt.status)
			continue
		}
		if tt.status != 200 {
			checkJSONError(t, a)
			continue
		}
		var rec struct {
			UserID string `json:"user_id"`
			Data   string `json:"data"`
		}
		if err := json.Unmarshal(a.body, &rec); err != nil || rec.Data != tt.data {
			t.Errorf("GET /get?%s = %s (%v), want data %q", tt.query, a.body, err, tt.data)
		}
		if q, _ := url.ParseQuery(tt.query); rec.UserID != q.Get("user_id") {
			t.Errorf("GET /get?%s names user %q, want %q", tt.query, rec.UserID, q.Get("user_id"))
		}
	}
}
