package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/server"
)

func TestDataAtLimitAcceptedWhateverItsCharacters(t *testing.T) {
	l := newLab(t)
	for _, c := range []string{`"`, `\`, "<", "\x01"} {
		data := strings.Repeat(c, server.MaxDataBytes)
		if a := l.insert(t, "k", data); a.status != http.StatusOK {
			t.Errorf("data of %d x %q (within MaxDataBytes): %d %s", server.MaxDataBytes, c, a.status, a.body)
		}
		if status, got := l.getData(t, "k"); status != http.StatusOK || got != data {
			t.Errorf("data of %d x %q did not read back unchanged (status %d)", server.MaxDataBytes, c, status)
		}
	}
}

func TestSurrogateEscapes(t *testing.T) {
	l := newLab(t)
	for _, body := range []string{
		`{"user_id":"a","data":"\ud800"}`, `{"user_id":"\udc00","data":"x"}`,
		`{"user_id":"a","data":"x\uD83Dy"}`, `{"user_id":"a","data":"\ude00\ud83d"}`,
		`{"user_id":"a","data":"\ud83d\u0041"}`,
	} {
		a := l.do(t, "POST", "/insert", "application/json", []byte(body))
		if a.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, a.status, a.body)
		}
		checkJSONError(t, a)
	}
	// A valid pair, and an escaped backslash before a u, are fine.
	for body, want := range map[string]string{
		`{"user_id":"a","data":"\ud83d\ude00"}`: "\U0001F600",
		`{"user_id":"b","data":"\\ud800"}`:      `\ud800`,
	} {
		a := l.do(t, "POST", "/insert", "application/json", []byte(body))
		if a.status != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", body, a.status, a.body)
			continue
		}
		key := "a"
		if strings.Contains(body, `"b"`) {
			key = "b"
		}
		if _, got := l.getData(t, key); got != want {
			t.Errorf("%s: stored %q, want %q", body, got, want)
		}
	}
}

// TestJSONTypeErrorsSpeakJSON: a value of the wrong JSON type is refused with a message
// that names the field and the JSON types, not encoding/json's Go types.
func TestJSONTypeErrorsSpeakJSON(t *testing.T) {
	l := newCounterLab(t)
	for _, tc := range []struct{ path, body, want string }{
		{"/insert", `{"user_id":"a","data":5}`, `field "data" must be a string, got a number`},
		{"/insert", `{"user_id":{"x":1},"data":"d"}`, `field "user_id" must be a string, got an object`},
		{"/insert", `{"user_id":true,"data":"d"}`, `field "user_id" must be a string, got a boolean`},
		{"/insert", `[1,2]`, "malformed JSON: want an object, got an array"},
		{"/insert", `"text"`, "malformed JSON: want an object, got a string"},
		{"/insert", `{"user_id":"a","data":"d"`, "malformed JSON: the body ends before the object does"},
		{"/insert", `{"user_id" "a"}`, "malformed JSON at byte 12: invalid character '\"' after object key"},
		{"/counter/incr", `{"key":"k","by":1.5}`, `field "by" must be an integer, got the number 1.5`},
		{"/counter/incr", `{"key":"k","by":"2"}`, `field "by" must be an integer, got a string`},
	} {
		a := l.do(t, "POST", tc.path, "application/json", []byte(tc.body))
		if a.status != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s, want 400", tc.path, tc.body, a.status, a.body)
			continue
		}
		checkJSONError(t, a)
		var got struct{ Error string }
		if err := json.Unmarshal(a.body, &got); err != nil || got.Error != tc.want {
			t.Errorf("%s %s: error %q (%v), want %q", tc.path, tc.body, got.Error, err, tc.want)
		}
	}
}

func TestFieldNamesExactAndOnce(t *testing.T) {
	l := newLab(t)
	for _, body := range []string{
		`{"USER_ID":"a","data":"x"}`, `{"user_id":"a","Data":"x"}`,
		`{"user_id":"a","user_id":"b","data":"x"}`, `{"user_id":"a","data":"x","data":"y"}`,
	} {
		a := l.do(t, "POST", "/insert", "application/json", []byte(body))
		if a.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, a.status, a.body)
		}
		checkJSONError(t, a)
	}
}

func TestMetricsWrongMethod(t *testing.T) {
	l := newLab(t)
	a := l.do(t, "POST", "/metrics", "", nil)
	if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != "GET" {
		t.Errorf("POST /metrics: %d Allow=%q %s; want 405 with Allow: GET", a.status, a.header.Get("Allow"), a.body)
	}
}

// getData reads key back through /get and returns the status and the data.
func (l *lab) getData(tb testing.TB, key string) (int, string) {
	tb.Helper()
	a := l.get(tb, key)
	var rec struct {
		Data string `json:"data"`
	}
	if a.status == http.StatusOK {
		if err := json.Unmarshal(a.body, &rec); err != nil {
			tb.Fatalf("GET %s: %v", key, err)
		}
	}
	return a.status, rec.Data
}
