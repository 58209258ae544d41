package auth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/proxy/auth"
)

func TestParseUsers(t *testing.T) {
	secret, err := auth.NewSecret("s3cret", 4096)
	if err != nil {
		t.Fatal(err)
	}
	u, err := auth.ParseUsers(strings.NewReader(`
; a comment
# another
"alice" "plain pass"
"bob"   "` + secret.String() + `"
"quo""te" "x"
`))
	if err != nil {
		t.Fatal(err)
	}
	if u.Len() != 3 {
		t.Fatalf("%d users, want 3", u.Len())
	}
	back, err := auth.ParseSecret(secret.String())
	if err != nil || back.String() != secret.String() {
		t.Fatalf("secret round trip: %v %v", back, err)
	}
	for _, tt := range []struct{ file, want string }{
		{`alice "x"`, "line 1: user name"},
		{`"alice" x`, "line 1: password of \"alice\""},
		{`"alice" "x" extra`, "line 1: unexpected text"},
		{"\n\"a\" \"md5" + strings.Repeat("0", 32) + `"`, "line 2: password of \"a\" is an MD5 hash"},
		{`"a" "SCRAM-SHA-256$x"`, "line 1: password of \"a\": malformed"},
		{`"a" ""`, "line 1: empty password"},
	} {
		_, err := auth.ParseUsers(strings.NewReader(tt.file))
		if !errors.Is(err, auth.ErrUsersFile) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err %v, want %q", tt.file, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "SCRAM-SHA-256$x") {
			t.Errorf("%q: the error shows the secret: %v", tt.file, err)
		}
	}
}
