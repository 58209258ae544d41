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
"carol" "` + secret.String() + `" "app_ro" "ro pass"
"dave" "d" "app_rw"
`))
	if err != nil {
		t.Fatal(err)
	}
	if u.Len() != 5 {
		t.Fatalf("%d users, want 5", u.Len())
	}
	for name, want := range map[string]auth.Login{
		"alice": {User: "alice", Password: "plain pass"}, // as itself, with its plain password
		"bob":   {User: "bob"},                           // a SCRAM secret gives no server password
		"carol": {User: "app_ro", Password: "ro pass"},
		"dave":  {User: "app_rw"},
	} {
		if got, ok := u.ServerLogin(name); !ok || got != want {
			t.Errorf("server login of %s: %+v, want %+v", name, got, want)
		}
	}
	if _, ok := u.ServerLogin("eve"); ok {
		t.Error("a user not in the file has a server login")
	}
	// A user on two lines is the last line's, login included.
	u, err = auth.ParseUsers(strings.NewReader(`"alice" "a" "postgres"` + "\n" + `"alice" "` + secret.String() + `"`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := u.ServerLogin("alice"); got != (auth.Login{User: "alice"}) {
		t.Errorf("alice on two lines runs as %+v, want herself as the last line says", got)
	}
	back, err := auth.ParseSecret(secret.String())
	if err != nil || back.String() != secret.String() {
		t.Fatalf("secret round trip: %v %v", back, err)
	}
	for _, tt := range []struct{ file, want string }{
		{`alice "x"`, "line 1: user name"},
		{`"alice" x`, "line 1: password of \"alice\""},
		{`"alice" "x" extra`, "line 1: unexpected text"},
		{`"alice" "x" "srv" extra`, "line 1: server password of \"alice\""},
		{`"alice" "x" "srv" "pw" extra`, "line 1: unexpected text after the server login"},
		{`"alice" "x" ""`, "line 1: unexpected text after the password"},
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
