package httpceiling_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/cmd/httpceiling"
)

// TestAnswersLikeTheDemoServer: loadgen reads /stats and counts a 200 on /get as a hit,
// so the ceiling must answer those endpoints with the demo-server's shapes.
func TestAnswersLikeTheDemoServer(t *testing.T) {
	ts := httptest.NewServer(httpceiling.Handler())
	defer ts.Close()
	for _, c := range []struct{ method, path, field string }{
		{"GET", "/get?user_id=x", "data"}, {"POST", "/insert", "shard"}, {"GET", "/healthz", "status"}, {"GET", "/stats", "shards"},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(`{"user_id":"x","data":"y"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || body[c.field] == nil {
			t.Errorf("%s %s: %d %v %v", c.method, c.path, resp.StatusCode, body, err)
		}
	}
}
