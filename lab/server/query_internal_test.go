package server

import (
	"net/url"
	"reflect"
	"testing"
)

// FuzzOnlyUserID: whenever /get's fast path reads a query string, url.ParseQuery (the
// general path) reads exactly one parameter from it, user_id, with the same value.
func FuzzOnlyUserID(f *testing.F) {
	for _, q := range []string{"user_id=a", "user_id=a+b%20c", "user_id=%zz", "user_id=a;b", "user_id=a&user_id=b", "user%5Fid=a", "user_id=", "x=1", ""} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		id, ok := onlyUserID(q)
		if !ok {
			return
		}
		vals, err := url.ParseQuery(q)
		if want := (url.Values{"user_id": {id}}); err != nil || !reflect.DeepEqual(vals, want) {
			t.Errorf("onlyUserID(%q) = %q, but url.ParseQuery gives %v, %v", q, id, vals, err)
		}
	})
}
