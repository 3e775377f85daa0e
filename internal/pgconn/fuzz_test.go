package pgconn_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/pgconn"
)

// FuzzRedactURL: for any connection string pgx accepts, the redacted form
// (String, LogValue, RedactURL) never contains the password pgx would send.
// No input panics.
func FuzzRedactURL(f *testing.F) {
	for _, s := range []string{
		"postgres://app:s3cret-pw@db:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem",
		"postgres://app@db/app?password=s3cret-pw&sslmode=disable",
		"host=db user=app password=s3cret-pw sslmode=disable",
		"host=db user=app password='s3cret pw \\' x' sslmode=disable",
		"host=db password = s3cret-pw user=app sslmode=disable",
		"postgresql://app:p%40ss%2Fword@db:5432,db2:5433/app?sslmode=disable",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		c := pgconn.Config{URL: u, MaxConns: 1}
		out := c.String() + c.GoString() + c.LogValue().String() + pgconn.RedactURL(u)
		_ = c.Validate()
		cc, err := pgx.ParseConfig(u)
		if err != nil || len(cc.Password) < 6 {
			return
		}
		pw := cc.Password
		others := []string{cc.User, cc.Host, cc.Database, "xxxxx", "postgres", "sslmode"}
		for _, v := range cc.RuntimeParams {
			others = append(others, v)
		}
		for _, fb := range cc.Fallbacks {
			others = append(others, fb.Host)
		}
		for _, o := range others {
			if strings.Contains(o, pw) {
				return
			}
		}
		if strings.Contains(out, pw) {
			t.Fatalf("password %q shown for %q: %s", pw, u, out)
		}
	})
}
